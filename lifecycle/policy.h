/* A sandbox's broker policy: the copy `cove create --policy` keeps as host configuration. */
#ifndef COVE_LIFECYCLE_POLICY_H
#define COVE_LIFECYCLE_POLICY_H

#include <stddef.h>

#define SBX_POLICY     "policy.json"
#define SBX_POLICY_MAX (256 * 1024)

/*
 * The checks cove makes before it keeps a policy (cove-broker checks the rest at every start):
 * 1..SBX_POLICY_MAX bytes, no NUL, one JSON object and nothing after it. 0 or -EINVAL/-EFBIG
 * with one line in err.
 */
int sbx_policy_check(const char *buf, size_t len, char *err, size_t errlen);

/*
 * Reads the user's policy file `path` (a regular file, at most SBX_POLICY_MAX bytes) and checks
 * it: 0 with *buf (malloc'd, NUL-terminated) and *len, or -errno with one line in err.
 */
int sbx_policy_load(const char *path, char **buf, size_t *len, char *err, size_t errlen);

/* Writes SBX_POLICY beneath the sandbox directory dfd, mode 0600 (temp file, fsync, rename). */
int sbx_policy_write(int dfd, const char *buf, size_t len);
/* The same as sbx_policy_load for the SBX_POLICY kept beneath a sandbox's dfd (not following a
 * link). */
int sbx_policy_load_at(int dfd, char **buf, size_t *len, char *err, size_t errlen);

#endif
