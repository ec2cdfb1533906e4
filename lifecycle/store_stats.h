/*
 * A sandbox's store counters on this host (`store-stats.json` in its directory), kept by the
 * host-side store processes (cove-store follow, push, pull, take) and read by `cove metrics`.
 * Counters only grow; each update is a read-add-write under an exclusive flock, so processes
 * that run at once (a follower and a stop's push) never lose each other's additions.
 */
#ifndef COVE_LIFECYCLE_STORE_STATS_H
#define COVE_LIFECYCLE_STORE_STATS_H

#include <stdint.h>

#define STORE_STATS_FILE "store-stats.json"

struct store_stats {
	uint64_t uploaded_bytes, uploaded_blobs, upload_errors, commits;
	uint64_t fetched_bytes, fetch_errors;
	uint64_t renewals, renewal_failures, takeovers, leases_lost;
	/* reconnects on this host that found its local copy (hits) or pulled it (misses) */
	uint64_t cache_hits, cache_misses;
	/* set, not added: the newest generation this host committed and when (0: none) */
	uint64_t generation;
	int64_t last_commit_ms;
};

/* Adds `d`'s counters (and sets its generation/last_commit_ms when non-zero). 0 or -errno. */
int store_stats_add(int dfd, const struct store_stats *d);
/* This host's counters for the sandbox at dfd; all zero (and 0) when it has none. */
int store_stats_load(int dfd, struct store_stats *s);

#endif
