/* virtio-blk device: request parsing and status over a block back end (blk_uring). */
#ifndef COVE_VIRTIO_BLK_H
#define COVE_VIRTIO_BLK_H

#include <stdbool.h>
#include <stdint.h>

#include "common/rate_limiter.h"
#include "devices/blk_uring.h"
#include "devices/device.h"
#include "devices/disk_spec.h"
#include "devices/overlay.h"
#include "devices/virtio_mmio.h"

#define VIRTIO_BLK_ID_BYTES 20

/*
 * Overlay I/O is synchronous on the event loop thread: at most this many bytes per
 * notification, however large the guest's requests (a request may be up to 4 GiB).
 */
#define VIRTIO_BLK_OVERLAY_TURN_BYTES (8ULL << 20)

struct blk_req;

struct virtio_blk {
	struct virtio_mmio mmio;
	struct blk_uring be;
	struct overlay *ov; /* copy-on-write overlay: synchronous I/O instead of be */
	const struct vm_host *host;
	bool watched;
	bool read_only;
	uint64_t capacity;   /* 512-byte sectors */
	uint32_t generation; /* bumped at reset: completions of older requests are dropped */
	/* An overlay request larger than one turn's budget, continued at the next kick. */
	struct blk_req *ov_req;
	uint64_t ov_done; /* bytes of it done */
	char serial[VIRTIO_BLK_ID_BYTES + 1];
	uint64_t requests, errors;
	/*
	 * Rate limit (--disk bw=,iops=): a request the limiter refuses stays in the avail ring
	 * (taken back, not failed) and the queue is left alone until rate_tfd fires. Its tokens
	 * are not part of a snapshot: a restored disk starts with full buckets.
	 */
	struct rate_limiter rl;
	bool throttled;			 /* waiting for rate_tfd */
	int rate_tfd;			 /* timerfd on the host's loop; -1 until a limit is set */
	uint64_t (*clock_ns)(void *ctx); /* the limiter's clock (unit tests use a fake) */
	void *clock_ctx;
	uint64_t throttle_waits; /* times the queue stopped for tokens */
};

/*
 * Opens the image (or, with `overlay` set, the read-only base `path` under that overlay) and
 * registers the device at `base`/`irq`. 0 or -errno, after one log line.
 */
/*
 * `layers` (may be NULL): frozen overlay layers under `overlay`, oldest first (restore of a
 * snapshot that froze the disk).
 */
int virtio_blk_create(struct virtio_blk *blk, const struct vm_host *host, const char *path,
		      bool read_only, const char *overlay, const char *const *layers, int nr_layers,
		      uint64_t base, uint32_t irq, const char *serial);
void virtio_blk_destroy(struct virtio_blk *blk);

/*
 * Sets (or with all zero, lifts) the disk's rate limit, with full buckets: at create, and at
 * run time from the API. 0 or -errno (a value over TB_MAX_TOKENS, no timerfd) after one log line.
 */
int virtio_blk_set_rate(struct virtio_blk *blk, const struct rate_limit *rate);
/* What the event loop does when the rate timer fires: serve the queue again (unit tests call it).
 */
void virtio_blk_rate_timer(struct virtio_blk *blk);

/* What the event loop does when io_uring completions are ready (unit tests call it). */
void virtio_blk_poll(struct virtio_blk *blk);

/* Completes every request in flight (the VM is paused): guest memory and used ring are final. */
void virtio_blk_quiesce(struct virtio_blk *blk);

/*
 * Snapshots, with the VM paused and the disk quiesced: if the overlay's top holds any data,
 * freeze it (it becomes a read-only layer at its path) and go on writing into a new empty
 * top at `new_top`.  *frozen = 1 when a layer was frozen, 0 when the top was empty (nothing
 * to do), and for a disk without an overlay.  0 or -errno with a message in `err`.
 */
int virtio_blk_freeze(struct virtio_blk *blk, const char *new_top, int *frozen, char *err,
		      size_t errlen);
/*
 * Snapshots, paused: puts a merge of the overlay's frozen layers (built while the guest ran,
 * devices/overlay_merge.h) in their place under the device lock, then flushes the top so its
 * map names the merged layer. 0, -ESTALE when the chain changed since (nothing done), -errno.
 */
struct overlay_merged;
int virtio_blk_merge_install(struct virtio_blk *blk, struct overlay_merged *m, char *err,
			     size_t errlen);

/* Device table entry: board_add(b, host, &virtio_blk_type, &(struct virtio_blk_cfg){...}). */
extern const struct device_type virtio_blk_type;
struct disk_chain;
struct virtio_blk_cfg {
	const struct disk_opt *disk;
	const struct disk_chain *chain; /* frozen overlay layers under its top, or NULL */
};
#endif
