/* --policy FILE of `cove create` and `cove template create`: checked first, kept in the
 * sandbox's (or template's) directory as policy.json. */
#ifndef COVE_CLI_POLICY_OPT_H
#define COVE_CLI_POLICY_OPT_H

#include <stddef.h>

#include "lifecycle/root.h"
#include "lifecycle/spec.h"

/* The --policy file is unreadable, not a JSON object, or refused by cove-broker. */
#define CREATE_EXIT_BAD_POLICY 69

/*
 * Reads the policy at path and has cove-broker check it, before anything is created: 0 with
 * the bytes to keep in *buf (malloc'd), else CREATE_EXIT_BAD_POLICY (or 1 when no cove-broker
 * can check it) after one line on stderr starting with `who`.
 */
int policy_take(const char *who, const char *path, char **buf, size_t *len);

/*
 * Keeps the policy as NAME/policy.json beneath root r (dfd: NAME's directory; host
 * configuration, like spec.json) and names it in s by its absolute path. 0 or -errno with one
 * line in err.
 */
int policy_keep(const struct sbx_root *r, const char *name, int dfd, struct sbx_spec *s,
		const char *buf, size_t len, char *err, size_t errlen);

#endif
