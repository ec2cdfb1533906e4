/* Tombstones: what is left of a deleted sandbox for 30 days (name, when, why), so that a later
 * command can say "deleted on ..." instead of "unknown". */
#ifndef COVE_LIFECYCLE_TOMBSTONE_H
#define COVE_LIFECYCLE_TOMBSTONE_H

#include <stddef.h>
#include <stdint.h>

#include "lifecycle/root.h"

/* ROOT/.deleted/NAME.json: a dot name no sandbox can have. */
#define SBX_TOMBSTONES	      ".deleted"
#define SBX_TOMBSTONE_KEEP_MS (30ULL * 24 * 3600 * 1000)

/* Leaves NAME's tombstone (why: "cove rm", "delete-after 30d"). 0 or -errno. */
int sbx_tombstone_write(const struct sbx_root *r, const char *name, const char *why);

/*
 * 0 with "NAME was deleted on DATE (why)" in msg when NAME has a tombstone younger than 30
 * days, -ENOENT otherwise.
 */
int sbx_tombstone_describe(const struct sbx_root *r, const char *name, char *msg, size_t cap);

/* Removes NAME's tombstone (a new sandbox takes the name). */
void sbx_tombstone_clear(const struct sbx_root *r, const char *name);

#endif
