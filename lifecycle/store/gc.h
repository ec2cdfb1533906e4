/*
 * Retention and garbage collection in the store. Retention keeps the newest `keep` generations
 * of each sandbox (all of a removed one's go). gc then deletes every blob no kept manifest
 * names, if it is older than the grace period: a blob an upload in flight has sent but whose
 * manifest is not committed yet is young, and stays. A manifest gc cannot authenticate (bad
 * MAC) stops it before anything is deleted: its blobs might be needed.
 */
#ifndef COVE_LIFECYCLE_STORE_GC_H
#define COVE_LIFECYCLE_STORE_GC_H

#include <stdint.h>

#include "lifecycle/store/sync.h"

#define STORE_GC_KEEP_DEFAULT  8
#define STORE_GC_GRACE_DEFAULT (24 * 3600) /* seconds */

struct store_gc_stats {
	uint64_t sandboxes, manifests_kept, manifests_removed;
	uint64_t blobs, blobs_kept, blobs_young, blobs_removed, bytes_removed;
};

/* `now`: seconds since the epoch (the caller's clock; tests move it). 0 or -errno + err. */
int store_gc(struct s3_client *c, const struct store_keyring *kr, unsigned keep, int64_t grace_s,
	     int64_t now, struct store_gc_stats *st, char *err, size_t errlen);

#endif
