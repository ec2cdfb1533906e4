/*
 * This host's sandboxes as a bounded cache of the store (issue 29): what the state root uses,
 * which local copies may be evicted, and in which order (least recently used first). Pure
 * functions over lists, so the rules have unit tests; cache_scan.h fills the lists.
 */
#ifndef COVE_LIFECYCLE_CACHE_H
#define COVE_LIFECYCLE_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lifecycle/name.h"
#include "lifecycle/state.h"

/* The smallest and largest bound accepted (cove gc --cache-max, store.json's "cache_max"). */
#define CACHE_MAX_MIN (1ULL << 20)
#define CACHE_MAX_MAX (1ULL << 60)

/* A bound as written ("512M", "2G"): size_parse, then within the limits above. 0 or -errno. */
int cache_max_parse(const char *s, uint64_t *out);

/* One file (any inode) under the state root, as the walk saw one of its names. */
struct cache_file {
	uint64_t dev, ino;
	uint64_t nlink; /* st_nlink: names it has anywhere */
	uint64_t bytes; /* st_blocks * 512 */
	int owner;	/* the sandbox (index) whose directory holds this name; -1: elsewhere */
};

/*
 * Counts each inode once (sorts f by device and inode): *usage = the allocated bytes of every
 * distinct inode; freeable[i] (nr_owners entries, set here) = the bytes that removing sandbox
 * i's directory would give back: inodes whose every name (st_nlink of them) is under it, so a
 * layer hard-linked by a fork, or linked from outside the root, counts for nobody.
 */
void cache_account(struct cache_file *f, size_t n, size_t nr_owners, uint64_t *usage,
		   uint64_t *freeable);

/* A local sandbox, as eviction sees it. */
struct cache_cand {
	char name[SBX_NAME_MAX + 1];
	enum sbx_state state;
	bool busy;	      /* a VMM, a start, a follower or a fork holds one of its locks */
	bool committed;	      /* its newest generation is the store's newest (checked) */
	bool audit;	      /* it has a broker audit log, which only this host keeps */
	int64_t last_used_ms; /* its event log's last state change (cove ls's since_ms) */
	uint64_t bytes;	      /* what evicting it frees (cache_account) */
};

/*
 * Why c is kept, or NULL when it may be evicted: only a stopped or crashed sandbox that
 * nothing holds, whose newest generation is committed in the store, that has no broker audit
 * log (the store does not keep one), and whose eviction frees something. Running and paused
 * sandboxes (and whatever they use) are never evicted.
 */
const char *cache_keep_reason(const struct cache_cand *c);

/*
 * Which candidates to evict so that `usage` comes down to `max`: evictable ones, least
 * recently used first (ties: by name), until the usage left is at most max. Their indices go
 * to order[] (room for n); returns how many; *after = the usage once they are gone (still
 * above max when not enough may be evicted).
 */
size_t cache_plan(const struct cache_cand *c, size_t n, uint64_t usage, uint64_t max, size_t *order,
		  uint64_t *after);

#endif
