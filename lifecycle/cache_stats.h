/*
 * This host's cache counters (`.cache-stats.json` in the state root): reconnects and starts
 * that found a local copy (hits) or pulled one from the store (misses), evictions and the bytes
 * they freed. Counters only grow; each update is a read-add-write under an exclusive flock, so
 * commands that run at once never lose each other's additions. `cove ls --cache` reports them.
 */
#ifndef COVE_LIFECYCLE_CACHE_STATS_H
#define COVE_LIFECYCLE_CACHE_STATS_H

#include <stdint.h>

#define CACHE_STATS_FILE ".cache-stats.json"

struct cache_stats {
	uint64_t hits, misses, evictions, evicted_bytes;
};

/* Adds d's counters (rootfd: the state root). 0 or -errno. */
int cache_stats_add(int rootfd, const struct cache_stats *d);
/* The counters; all zero when there are none yet (or the file is not ours). 0 or -errno. */
int cache_stats_load(int rootfd, struct cache_stats *s);

#endif
