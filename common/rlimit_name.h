/* Resource limits by name (RLIMIT_NOFILE...), as the OCI runtime spec's process.rlimits, cove exec
 * --rlimit and the agent's exec op name them: one table for the host and cove-init. */
#ifndef COVE_COMMON_RLIMIT_NAME_H
#define COVE_COMMON_RLIMIT_NAME_H

#include <stddef.h>
#include <stdint.h>

#define RLIMITS_MAX	 32		       /* limits in one process object or exec request */
#define RLIMIT_UNLIMITED UINT64_MAX	       /* RLIM_INFINITY; -1 on the agent's wire */
#define RLIMIT_VALUE_MAX ((uint64_t)INT64_MAX) /* a finite value (what JSON integers hold) */
#define RLIMIT_ARG_MAX	 64 /* "RLIMIT_SIGPENDING=N:N" with two 19-digit numbers */

struct rlimit_val {
	int resource; /* RLIMIT_* */
	uint64_t soft, hard;
};

/* Pure: "RLIMIT_NOFILE" -> RLIMIT_NOFILE; -1 for a name not in the table. */
int rlimit_resource(const char *name);
/* Pure: the name of a resource of the table, or NULL. */
const char *rlimit_name(int resource);

/*
 * Pure: cove exec's "NAME=SOFT:HARD" (NAME with or without RLIMIT_, any case; SOFT and HARD
 * decimal or "unlimited", SOFT <= HARD) into v. 0 or -EINVAL with one line in err.
 */
int rlimit_arg_parse(const char *arg, struct rlimit_val *v, char *err, size_t errlen);
/* Pure: v as "RLIMIT_NAME=SOFT:HARD" ("unlimited" for RLIMIT_UNLIMITED), which
 * rlimit_arg_parse reads back. 0, or -ENOSPC when cap is too small. */
int rlimit_arg_format(const struct rlimit_val *v, char *out, size_t cap);

#endif
