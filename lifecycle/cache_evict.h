/* Evicting one sandbox's local copy (issue 29): its files go, its record stays in the store. */
#ifndef COVE_LIFECYCLE_CACHE_EVICT_H
#define COVE_LIFECYCLE_CACHE_EVICT_H

#include <stddef.h>

#include "lifecycle/root.h"

/*
 * Asked with the sandbox's start lock held (nothing can start, stop or fork it meanwhile):
 * 0 when its newest state is committed in the store, else non-zero with why in why[whylen].
 */
typedef int (*cache_committed_fn)(void *arg, const char *name, int dfd, char *why, size_t whylen);

/*
 * Removes the local copy of sandbox `name`: under its start lock (not waited for) and its
 * follower's lock, only when it is stopped or crashed, no VMM holds it, and committed() says
 * its newest state is in the store, and has no broker audit log. Its cove-broker, if one
 * lingers, is ended and its runtime directory goes; then its directory is renamed to a hidden
 * name (from then on a command finds no local copy and pulls it from the store) and removed.
 * No tombstone is written, here or in the store. 0; -EBUSY or -ESTALE with one line in err (left
 * alone); -errno.
 */
int cache_evict(const struct sbx_root *r, const char *name, cache_committed_fn committed, void *arg,
		char *err, size_t errlen);

#endif
