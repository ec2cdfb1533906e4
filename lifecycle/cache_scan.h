/* The state root measured for the cache (cache.h): its usage, and every local sandbox. */
#ifndef COVE_LIFECYCLE_CACHE_SCAN_H
#define COVE_LIFECYCLE_CACHE_SCAN_H

#include <stddef.h>
#include <stdint.h>

#include "lifecycle/cache.h"
#include "lifecycle/root.h"

/* The follower's lock (lifecycle/store/reconnect.h: STORE_FOLLOW_LOCK): held while it uploads. */
#define CACHE_FOLLOW_LOCK "store-follow.lock"

/*
 * Walks the state root without following links: *usage = the allocated bytes of every distinct
 * inode under it (hard links once); *out (malloc'ed, *n entries) = every sandbox directory with
 * its state, last use, whether a lock is held and the bytes only it holds. `committed` is left
 * false: only the store can answer it. 0 or -errno with one line in err.
 */
int cache_scan(const struct sbx_root *r, struct cache_cand **out, size_t *n, uint64_t *usage,
	       char *err, size_t errlen);

#endif
