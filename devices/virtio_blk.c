/*
 * virtio-blk: chains become back-end reads/writes/flushes/discards/write-zeroes; guest errors
 * fail requests.
 */
#include "devices/virtio_blk.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/errmsg.h"
#include "devices/board.h"
#include "devices/overlay_merge.h"

#define VIRTIO_ID_BLOCK 2

#define VIRTIO_BLK_F_SEG_MAX	  (1ULL << 2)
#define VIRTIO_BLK_F_RO		  (1ULL << 5)
#define VIRTIO_BLK_F_BLK_SIZE	  (1ULL << 6)
#define VIRTIO_BLK_F_FLUSH	  (1ULL << 9)
#define VIRTIO_BLK_F_DISCARD	  (1ULL << 13)
#define VIRTIO_BLK_F_WRITE_ZEROES (1ULL << 14)

#define VIRTIO_BLK_T_IN		  0
#define VIRTIO_BLK_T_OUT	  1
#define VIRTIO_BLK_T_FLUSH	  4
#define VIRTIO_BLK_T_GET_ID	  8
#define VIRTIO_BLK_T_DISCARD	  11
#define VIRTIO_BLK_T_WRITE_ZEROES 13

#define VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP 1u

#define VIRTIO_BLK_S_OK	    0
#define VIRTIO_BLK_S_IOERR  1
#define VIRTIO_BLK_S_UNSUPP 2

#define SECTOR_SIZE		 512ULL
#define HDR_SIZE		 16
#define SEG_MAX			 (VIRTQ_MAX_SEGS - 2) /* header and status take one descriptor each */
#define MAX_DISCARD_SECTORS	 (1U << 22)	      /* 2 GiB per request */
#define MAX_WRITE_ZEROES_SECTORS (1U << 22)	      /* 2 GiB per request */

struct blk_config {
	uint64_t capacity;
	uint32_t size_max;
	uint32_t seg_max;
	uint16_t cylinders;
	uint8_t heads;
	uint8_t sectors;
	uint32_t blk_size;
	uint8_t physical_block_exp;
	uint8_t alignment_offset;
	uint16_t min_io_size;
	uint32_t opt_io_size;
	uint8_t writeback;
	uint8_t unused0;
	uint16_t num_queues;
	uint32_t max_discard_sectors;
	uint32_t max_discard_seg;
	uint32_t discard_sector_alignment;
	uint32_t max_write_zeroes_sectors;
	uint32_t max_write_zeroes_seg;
	uint8_t write_zeroes_may_unmap;
	uint8_t unused1[3];
} __attribute__((packed));
_Static_assert(__builtin_offsetof(struct blk_config, max_write_zeroes_sectors) == 48,
	       "virtio-blk config layout");

struct blk_req_hdr {
	uint32_t type;
	uint32_t reserved;
	uint64_t sector;
};

struct blk_discard_seg {
	uint64_t sector;
	uint32_t num_sectors;
	uint32_t flags;
};

struct blk_req {
	struct blk_io io; /* first: the back end hands this pointer back */
	struct virtio_blk *blk;
	uint32_t generation;
	uint32_t q;
	uint32_t used_len;
	struct virtq_chain chain;
	struct iovec iov[VIRTQ_MAX_SEGS];
};

static void config_read(void *dev, uint32_t off, uint8_t *data, uint32_t len)
{
	struct virtio_blk *blk = dev;
	struct blk_config c = {
	    .capacity = blk->capacity,
	    .seg_max = SEG_MAX,
	    .blk_size = SECTOR_SIZE,
	    .num_queues = 1,
	    .max_discard_sectors = MAX_DISCARD_SECTORS,
	    .max_discard_seg = 1,
	    .discard_sector_alignment = 8,
	    .max_write_zeroes_sectors = MAX_WRITE_ZEROES_SECTORS,
	    .max_write_zeroes_seg = 1,
	    .write_zeroes_may_unmap = 1,
	};
	/* The transport checked [off, off+len) against config_size. */
	memcpy(data, (uint8_t *)&c + off, len);
}

/*
 * Writes the status byte, returns the chain to the driver and marks what the device wrote. A
 * chain without a device-writable last segment has no place for a status: the device must not
 * write into memory the driver gave it to read, so it returns the chain with nothing written.
 */
static void finish(struct virtio_blk *blk, uint32_t q, const struct virtq_chain *c, uint8_t status,
		   uint32_t data_written)
{
	struct virtio_mmio *t = &blk->mmio;
	const struct virtq_seg *last = c->nr ? &c->seg[c->nr - 1] : NULL;
	if (!last || !last->write || !last->len) {
		blk->errors++;
		virtq_push(&t->queues[q], c->head, 0);
		return;
	}
	uint64_t status_gpa = last->gpa + last->len - 1;
	uint8_t *p = guest_mem_ptr(t->mem, status_gpa, 1);
	if (p) {
		*p = status;
		virtio_mmio_mark_dirty(t, status_gpa, 1);
	}
	if (status != VIRTIO_BLK_S_OK)
		blk->errors++;
	virtq_push(&t->queues[q], c->head, data_written + 1);
}

/* Marks the first `len` bytes of the writable segments dirty. */
static void mark_written(struct virtio_blk *blk, const struct virtq_chain *c, uint64_t len)
{
	for (uint32_t i = c->nr_out; i < c->nr && len; i++) {
		uint64_t n = c->seg[i].len < len ? c->seg[i].len : len;
		virtio_mmio_mark_dirty(&blk->mmio, c->seg[i].gpa, n);
		len -= n;
	}
}

static void req_done(struct blk_io *io, int res)
{
	struct blk_req *req = (struct blk_req *)io;
	struct virtio_blk *blk = req->blk;
	/*
	 * Whatever the outcome (failed, short, cancelled, or from before a reset), the kernel may
	 * have written into the guest's buffers: a snapshot must see those pages.
	 */
	if (req->io.op == BLK_OP_READ)
		mark_written(blk, &req->chain, req->used_len);
	/* A reset since submission: the driver forgot this request; only free it. */
	if (req->generation == blk->generation && res != -ECANCELED) {
		uint8_t st = res == 0		  ? VIRTIO_BLK_S_OK
			     : res == -EOPNOTSUPP ? VIRTIO_BLK_S_UNSUPP /* no hole punching here */
						  : VIRTIO_BLK_S_IOERR;
		finish(blk, req->q, &req->chain, st, res ? 0 : req->used_len);
		if (res)
			log_debug(blk->host->log, "%s: request failed: %s", blk->serial,
				  strerror(-res));
	}
	free(req);
}

/* Slices [skip, skip+len) of the segments [first, last) into host iovecs. */
static int build_iov(struct virtio_blk *blk, struct blk_req *req, uint32_t first, uint32_t last,
		     uint64_t skip, uint64_t len)
{
	const struct virtq_chain *c = &req->chain;
	int n = 0;
	for (uint32_t i = first; i < last && len; i++) {
		const struct virtq_seg *s = &c->seg[i];
		if (skip >= s->len) {
			skip -= s->len;
			continue;
		}
		uint64_t take = s->len - skip;
		if (take > len)
			take = len;
		void *p = guest_mem_ptr(blk->mmio.mem, s->gpa + skip, take);
		if (!p)
			return -EFAULT;
		req->iov[n++] = (struct iovec){.iov_base = p, .iov_len = take};
		len -= take;
		skip = 0;
	}
	return len ? -EFAULT : n;
}

static bool range_ok(const struct virtio_blk *blk, uint64_t sector, uint64_t bytes)
{
	if (bytes % SECTOR_SIZE)
		return false;
	uint64_t n = bytes / SECTOR_SIZE;
	return sector <= blk->capacity && n <= blk->capacity - sector;
}

/* Marks [skip, skip+len) of the writable segments dirty. */
static void mark_written_range(struct virtio_blk *blk, const struct virtq_chain *c, uint64_t skip,
			       uint64_t len)
{
	for (uint32_t i = c->nr_out; i < c->nr && len; i++) {
		const struct virtq_seg *s = &c->seg[i];
		if (skip >= s->len) {
			skip -= s->len;
			continue;
		}
		uint64_t n = s->len - skip < len ? s->len - skip : len;
		virtio_mmio_mark_dirty(&blk->mmio, s->gpa + skip, n);
		len -= n;
		skip = 0;
	}
}

/* The iovecs covering [skip, skip+len) of `src`; returns how many were written to `dst`. */
static int iov_slice(const struct iovec *src, int nsrc, uint64_t skip, uint64_t len,
		     struct iovec *dst)
{
	int n = 0;
	for (int i = 0; i < nsrc && len; i++) {
		if (skip >= src[i].iov_len) {
			skip -= src[i].iov_len;
			continue;
		}
		uint64_t k = src[i].iov_len - skip < len ? src[i].iov_len - skip : len;
		dst[n++] =
		    (struct iovec){.iov_base = (uint8_t *)src[i].iov_base + skip, .iov_len = k};
		len -= k;
		skip = 0;
	}
	return n;
}

#define OV_MORE (-1)

/*
 * Overlay disks are served synchronously here, on the event loop thread, under the transport
 * lock (io_uring for overlays is future work, see OVERLAY.md). Each call does at most *budget
 * bytes of the request (taking them off the budget) from blk->ov_done on: a status when the
 * request is finished, OV_MORE when the rest waits for the next turn.
 */
static int overlay_step(struct virtio_blk *blk, struct blk_req *req, uint64_t *budget)
{
	struct blk_io *io = &req->io;
	uint64_t done = blk->ov_done, n = 0;
	struct iovec part[VIRTQ_MAX_SEGS];
	int r;
	if (io->op == BLK_OP_READ || io->op == BLK_OP_WRITE || io->op == BLK_OP_WRITE_ZEROES) {
		n = io->len - done < *budget ? io->len - done : *budget;
		if (!n)
			return OV_MORE;
	}
	switch (io->op) {
	case BLK_OP_READ:
		r = overlay_read(blk->ov, io->offset + done, part,
				 iov_slice(io->iov, io->niov, done, n, part), n);
		if (!r) /* marked as each slice lands: a snapshot may come between slices */
			mark_written_range(blk, &req->chain, done, n);
		break;
	case BLK_OP_WRITE:
		r = overlay_write(blk->ov, io->offset + done, part,
				  iov_slice(io->iov, io->niov, done, n, part), n);
		break;
	case BLK_OP_FLUSH:
		r = overlay_flush(blk->ov);
		break;
	case BLK_OP_WRITE_ZEROES:
		r = overlay_write_zeroes(blk->ov, io->offset + done, n, io->unmap);
		break;
	default:
		return VIRTIO_BLK_S_UNSUPP; /* discard is not offered on overlays */
	}
	*budget -= n;
	if (r) {
		req->used_len = 0;
		log_debug(blk->host->log, "%s: overlay request failed: %s", blk->serial,
			  strerror(-r));
		return VIRTIO_BLK_S_IOERR;
	}
	blk->ov_done = done + n;
	if (n && blk->ov_done < io->len)
		return OV_MORE;
	return VIRTIO_BLK_S_OK;
}

/* Returns a status to finish with now, or -1 when the request went to the back end. */
static int start_request(struct virtio_blk *blk, struct blk_req *req)
{
	struct virtq_chain *c = &req->chain;
	struct blk_req_hdr h;
	if (virtq_chain_read(&blk->mmio.queues[req->q], c, 0, &h, sizeof(h)) != sizeof(h))
		return VIRTIO_BLK_S_IOERR;
	uint64_t in_data = c->in_len - 1; /* the last writable byte is the status */
	uint64_t out_data = c->out_len - HDR_SIZE;
	int n;
	switch (h.type) {
	case VIRTIO_BLK_T_IN:
		if (!range_ok(blk, h.sector, in_data))
			return VIRTIO_BLK_S_IOERR;
		if (in_data == 0)
			return VIRTIO_BLK_S_OK;
		n = build_iov(blk, req, c->nr_out, c->nr, 0, in_data);
		if (n < 0)
			return VIRTIO_BLK_S_IOERR;
		req->io = (struct blk_io){.op = BLK_OP_READ,
					  .offset = h.sector * SECTOR_SIZE,
					  .len = in_data,
					  .iov = req->iov,
					  .niov = n};
		req->used_len = (uint32_t)in_data;
		break;
	case VIRTIO_BLK_T_OUT:
		if (blk->read_only || !range_ok(blk, h.sector, out_data))
			return VIRTIO_BLK_S_IOERR;
		if (out_data == 0)
			return VIRTIO_BLK_S_OK;
		n = build_iov(blk, req, 0, c->nr_out, HDR_SIZE, out_data);
		if (n < 0)
			return VIRTIO_BLK_S_IOERR;
		req->io = (struct blk_io){.op = BLK_OP_WRITE,
					  .offset = h.sector * SECTOR_SIZE,
					  .len = out_data,
					  .iov = req->iov,
					  .niov = n};
		break;
	case VIRTIO_BLK_T_FLUSH:
		if (blk->read_only)
			return VIRTIO_BLK_S_OK;
		req->io = (struct blk_io){.op = BLK_OP_FLUSH};
		break;
	case VIRTIO_BLK_T_GET_ID: {
		uint8_t id[VIRTIO_BLK_ID_BYTES] = {0};
		memcpy(id, blk->serial, strnlen(blk->serial, sizeof(id)));
		uint64_t len = in_data < sizeof(id) ? in_data : sizeof(id);
		uint64_t done = 0;
		for (uint32_t i = c->nr_out; i < c->nr && done < len; i++) {
			uint64_t k = c->seg[i].len < len - done ? c->seg[i].len : len - done;
			uint8_t *p = guest_mem_ptr(blk->mmio.mem, c->seg[i].gpa, k);
			if (!p)
				return VIRTIO_BLK_S_IOERR;
			memcpy(p, id + done, k);
			virtio_mmio_mark_dirty(&blk->mmio, c->seg[i].gpa, k);
			done += k;
		}
		req->used_len = (uint32_t)done;
		return VIRTIO_BLK_S_OK;
	}
	case VIRTIO_BLK_T_WRITE_ZEROES: {
		struct blk_discard_seg d;
		if (blk->read_only || out_data != sizeof(d) ||
		    virtq_chain_read(&blk->mmio.queues[req->q], c, HDR_SIZE, &d, sizeof(d)) !=
			sizeof(d))
			return VIRTIO_BLK_S_IOERR;
		if ((d.flags & ~VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP) ||
		    d.num_sectors > MAX_WRITE_ZEROES_SECTORS)
			return VIRTIO_BLK_S_UNSUPP;
		if (!range_ok(blk, d.sector, (uint64_t)d.num_sectors * SECTOR_SIZE))
			return VIRTIO_BLK_S_IOERR;
		if (d.num_sectors == 0)
			return VIRTIO_BLK_S_OK;
		req->io = (struct blk_io){.op = BLK_OP_WRITE_ZEROES,
					  .offset = d.sector * SECTOR_SIZE,
					  .len = (uint64_t)d.num_sectors * SECTOR_SIZE,
					  .unmap = d.flags & VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP};
		break;
	}
	case VIRTIO_BLK_T_DISCARD: {
		struct blk_discard_seg d;
		if (blk->read_only || out_data != sizeof(d) ||
		    virtq_chain_read(&blk->mmio.queues[req->q], c, HDR_SIZE, &d, sizeof(d)) !=
			sizeof(d))
			return VIRTIO_BLK_S_IOERR;
		if (d.flags || d.num_sectors > MAX_DISCARD_SECTORS)
			return VIRTIO_BLK_S_UNSUPP;
		if (!range_ok(blk, d.sector, (uint64_t)d.num_sectors * SECTOR_SIZE))
			return VIRTIO_BLK_S_IOERR;
		if (d.num_sectors == 0)
			return VIRTIO_BLK_S_OK;
		req->io = (struct blk_io){.op = BLK_OP_DISCARD,
					  .offset = d.sector * SECTOR_SIZE,
					  .len = (uint64_t)d.num_sectors * SECTOR_SIZE};
		break;
	}
	default:
		return VIRTIO_BLK_S_UNSUPP;
	}
	req->io.done = req_done;
	if (blk->ov)
		return -1; /* the caller runs overlay_step() within its budget */
	return blk_uring_queue(&blk->be, &req->io) ? VIRTIO_BLK_S_IOERR : -1;
}

/* Continues the pending overlay request; true when it finished (pushed) or there was none. */
static bool overlay_continue(struct virtio_blk *blk, uint64_t *budget, bool *pushed)
{
	struct blk_req *req = blk->ov_req;
	if (!req)
		return true;
	int st = overlay_step(blk, req, budget);
	if (st == OV_MORE)
		return false;
	finish(blk, req->q, &req->chain, (uint8_t)st, req->used_len);
	*pushed = true;
	blk->ov_req = NULL;
	free(req);
	return true;
}

/*
 * What a chain costs the limiter: its data bytes, from the chain's own lengths (the guest may
 * rewrite the header after we look, the descriptors it cannot), so a read or a write is
 * charged exactly and everything else (flush, get-id, a discard's segment) next to nothing.
 */
static uint64_t chain_data_bytes(const struct virtq_chain *c)
{
	uint64_t out = c->out_len > HDR_SIZE ? c->out_len - HDR_SIZE : 0;
	return out + (c->in_len ? c->in_len - 1 : 0);
}

/*
 * Takes the limiter's tokens for chain `c`: true when it may go. Otherwise the chain goes back
 * to the avail ring (it was the last one popped: the driver sees nothing) and rate_tfd is armed
 * for when the tokens are there.
 */
static bool rate_admit(struct virtio_blk *blk, struct virtq *q, const struct virtq_chain *c)
{
	if (rate_limiter_unlimited(&blk->rl))
		return true;
	uint64_t wait =
	    rate_limiter_consume(&blk->rl, chain_data_bytes(c), blk->clock_ns(blk->clock_ctx));
	if (!wait)
		return true;
	q->last_avail--;
	blk->throttled = true;
	blk->throttle_waits++;
	struct itimerspec its = {.it_value = {.tv_sec = (time_t)(wait / 1000000000ULL),
					      .tv_nsec = (long)(wait % 1000000000ULL)}};
	if (timerfd_settime(blk->rate_tfd, 0, &its, NULL))
		log_warn(blk->host->log, "%s: rate timer: %s", blk->serial, strerror(errno));
	return false;
}

/*
 * At most VIRTIO_NOTIFY_BUDGET chains and VIRTIO_BLK_OVERLAY_TURN_BYTES of overlay I/O per
 * call; with work left the queue is deferred (re-kicked after the event loop's other fds).
 */
static void queue_notify(void *dev, struct virtio_mmio *t, uint32_t q)
{
	struct virtio_blk *blk = dev;
	bool pushed = false;
	uint64_t bytes = VIRTIO_BLK_OVERLAY_TURN_BYTES;
	if (!overlay_continue(blk, &bytes, &pushed)) {
		virtio_mmio_defer(t, q);
		goto out;
	}
	for (uint32_t n = 0;; n++) {
		if (blk->throttled)
			break; /* the rate timer serves the queue again */
		if (n == VIRTIO_NOTIFY_BUDGET || !bytes) {
			virtio_mmio_defer(t, q);
			break;
		}
		struct blk_req *req = malloc(sizeof(*req));
		if (!req)
			break; /* try again at the next kick */
		req->blk = blk;
		req->generation = blk->generation;
		req->q = q;
		req->used_len = 0;
		int r = virtq_pop(&t->queues[q], &req->chain);
		if (r == 0) {
			free(req);
			break;
		}
		if (r < 0) {
			free(req);
			virtio_mmio_set_needs_reset(t);
			break;
		}
		if (!rate_admit(blk, &t->queues[q], &req->chain)) {
			free(req);
			break;
		}
		blk->requests++;
		struct virtq_chain *c = &req->chain;
		/* Every request has a readable header and a writable status byte. */
		int st = (c->out_len < HDR_SIZE || c->in_len < 1) ? VIRTIO_BLK_S_IOERR
								  : start_request(blk, req);
		if (st < 0 && blk->ov) {
			blk->ov_req = req;
			blk->ov_done = 0;
			if (!overlay_continue(blk, &bytes, &pushed)) {
				virtio_mmio_defer(t, q);
				break;
			}
			continue;
		}
		if (st >= 0) {
			finish(blk, q, c, (uint8_t)st, req->used_len);
			pushed = true;
			free(req);
		}
	}
out:
	blk_uring_submit(&blk->be);
	if (pushed)
		virtio_mmio_notify_used(t, q);
}

static void on_completion(void *opaque, uint32_t events)
{
	struct virtio_blk *blk = opaque;
	(void)events;
	pthread_mutex_lock(&blk->mmio.lock);
	uint64_t before = blk->mmio.queues[0].used_idx;
	blk_uring_reap(&blk->be);
	if (blk->mmio.queues[0].used_idx != before)
		virtio_mmio_notify_used(&blk->mmio, 0);
	pthread_mutex_unlock(&blk->mmio.lock);
}

static void dev_reset(void *dev)
{
	struct virtio_blk *blk = dev;
	blk->generation++;
	/*
	 * Reads in flight would land in guest pages after the reset: wait for every request
	 * (they complete as stale, only marking what they wrote) before the reset is done.
	 */
	blk_uring_drain(&blk->be);
	/* The driver forgot it: a partly done overlay request is dropped, as a real disk would. */
	free(blk->ov_req);
	blk->ov_req = NULL;
}

static const struct virtio_dev_ops blk_ops_rw = {
    .name = "virtio-blk",
    .device_id = VIRTIO_ID_BLOCK,
    .features = VIRTIO_BLK_F_SEG_MAX | VIRTIO_BLK_F_BLK_SIZE | VIRTIO_BLK_F_FLUSH |
		VIRTIO_BLK_F_DISCARD | VIRTIO_BLK_F_WRITE_ZEROES | VIRTIO_F_RING_INDIRECT_DESC |
		VIRTIO_F_RING_EVENT_IDX,
    .nr_queues = 1,
    .config_size = sizeof(struct blk_config),
    .config_read = config_read,
    .queue_notify = queue_notify,
    .reset = dev_reset,
};

static const struct virtio_dev_ops blk_ops_ro = {
    .name = "virtio-blk",
    .device_id = VIRTIO_ID_BLOCK,
    .features = VIRTIO_BLK_F_SEG_MAX | VIRTIO_BLK_F_BLK_SIZE | VIRTIO_BLK_F_FLUSH |
		VIRTIO_BLK_F_RO | VIRTIO_F_RING_INDIRECT_DESC | VIRTIO_F_RING_EVENT_IDX,
    .nr_queues = 1,
    .config_size = sizeof(struct blk_config),
    .config_read = config_read,
    .queue_notify = queue_notify,
    .reset = dev_reset,
};

/*
 * Overlays are not offered DISCARD: punching the data file would let stale base data show.
 * WRITE_ZEROES is fine: zeros are written through the overlay (chunks become allocated).
 */
static const struct virtio_dev_ops blk_ops_overlay = {
    .name = "virtio-blk",
    .device_id = VIRTIO_ID_BLOCK,
    .features = VIRTIO_BLK_F_SEG_MAX | VIRTIO_BLK_F_BLK_SIZE | VIRTIO_BLK_F_FLUSH |
		VIRTIO_BLK_F_WRITE_ZEROES | VIRTIO_F_RING_INDIRECT_DESC | VIRTIO_F_RING_EVENT_IDX,
    .nr_queues = 1,
    .config_size = sizeof(struct blk_config),
    .config_read = config_read,
    .queue_notify = queue_notify,
    .reset = dev_reset,
};

static void close_backend(struct virtio_blk *blk)
{
	if (blk->ov) {
		/* Writes the map one last time: a clean stop keeps even unflushed writes. */
		int r = overlay_close(blk->ov);
		if (r)
			log_err(blk->host->log, "%s: overlay: cannot save the map: %s", blk->serial,
				strerror(-r));
		free(blk->ov);
		blk->ov = NULL;
	}
	blk_uring_close(&blk->be);
}

static int open_overlay(struct virtio_blk *blk, struct logger *log, const char *path,
			const char *overlay, const char *const *layers, int nr_layers)
{
	char err[512];
	blk->be.fd = blk->be.efd = -1; /* no io_uring back end */
	blk->ov = calloc(1, sizeof(*blk->ov));
	if (!blk->ov)
		return -ENOMEM;
	const char *chain[OVERLAY_CHAIN_MAX];
	if (nr_layers < 0 || nr_layers >= OVERLAY_CHAIN_MAX) {
		free(blk->ov);
		blk->ov = NULL;
		log_err(log, "disk %s: %d overlay layers is over the cap", path, nr_layers);
		return -E2BIG;
	}
	for (int i = 0; i < nr_layers; i++)
		chain[i] = layers[i];
	chain[nr_layers] = overlay;
	int r = overlay_open_chain(blk->ov, path, chain, nr_layers + 1, 0, err, sizeof(err));
	if (r) {
		log_err(log, "disk %s: %s", path, err);
		free(blk->ov);
		blk->ov = NULL;
		return r;
	}
	blk->capacity = blk->ov->disk_size / SECTOR_SIZE;
	return 0;
}

static uint64_t mono_clock(void *ctx)
{
	(void)ctx;
	return mono_ns();
}

static void on_rate_timer(void *opaque, uint32_t events)
{
	(void)events;
	virtio_blk_rate_timer(opaque);
}

void virtio_blk_rate_timer(struct virtio_blk *blk)
{
	struct virtio_mmio *t = &blk->mmio;
	uint64_t ticks;
	if (blk->rate_tfd >= 0 && read(blk->rate_tfd, &ticks, sizeof(ticks)) < 0) {
		/* EAGAIN: a unit test's call, or already read */
	}
	pthread_mutex_lock(&t->lock);
	blk->throttled = false;
	/* What a kick does: only a live, ready queue is served. */
	if (t->queues[0].ready && (t->status & VIRTIO_STATUS_DRIVER_OK) &&
	    !(t->status & VIRTIO_STATUS_NEEDS_RESET))
		queue_notify(blk, t, 0);
	pthread_mutex_unlock(&t->lock);
}

int virtio_blk_set_rate(struct virtio_blk *blk, const struct rate_limit *rate)
{
	struct rate_limiter rl;
	int r = rate_limiter_init(&rl, rate, blk->clock_ns(blk->clock_ctx));
	if (r) {
		log_err(blk->host->log, "%s: rate limit out of range", blk->serial);
		return r;
	}
	pthread_mutex_lock(&blk->mmio.lock);
	if (blk->rate_tfd < 0 && !rate_limiter_unlimited(&rl)) {
		int fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
		r = fd < 0 ? -errno : evloop_add(blk->host->loop, fd, EPOLLIN, on_rate_timer, blk);
		if (r) {
			if (fd >= 0)
				close(fd);
			pthread_mutex_unlock(&blk->mmio.lock);
			log_err(blk->host->log, "%s: rate timer: %s", blk->serial, strerror(-r));
			return r;
		}
		blk->rate_tfd = fd;
	}
	blk->rl = rl;
	bool was = blk->throttled;
	pthread_mutex_unlock(&blk->mmio.lock);
	if (was) /* a new limit (or none): look at the queue again now */
		virtio_blk_rate_timer(blk);
	if (!rate_limiter_unlimited(&rl))
		log_info(blk->host->log,
			 "%s: rate limit %llu bytes/s (burst %llu), %llu ops/s (burst %llu)",
			 blk->serial, (unsigned long long)rate->bw,
			 (unsigned long long)rate->bw_burst, (unsigned long long)rate->iops,
			 (unsigned long long)rate->iops_burst);
	return 0;
}

int virtio_blk_create(struct virtio_blk *blk, const struct vm_host *host, const char *path,
		      bool read_only, const char *overlay, const char *const *layers, int nr_layers,
		      uint64_t base, uint32_t irq, const char *serial)
{
	memset(blk, 0, sizeof(*blk));
	blk->host = host;
	blk->rate_tfd = -1;
	blk->clock_ns = mono_clock;
	struct logger *log = host->log;
	blk->read_only = read_only;
	snprintf(blk->serial, sizeof(blk->serial), "%s", serial);
	int r;
	if (overlay) {
		r = open_overlay(blk, log, path, overlay, layers, nr_layers);
		if (r)
			return r;
	} else {
		r = blk_uring_open(&blk->be, path, read_only);
		if (r) {
			log_err(log, "disk %s: %s", path, strerror(-r));
			return r;
		}
		blk->capacity = blk->be.size / SECTOR_SIZE;
	}
	r = virtio_mmio_create(&blk->mmio, host, base, irq,
			       overlay	   ? &blk_ops_overlay
			       : read_only ? &blk_ops_ro
					   : &blk_ops_rw,
			       blk);
	if (r)
		goto fail_be;
	if (overlay) {
		log_info(log, "disk %s: %llu sectors, copy-on-write overlay %s (%u KiB chunks)",
			 path, (unsigned long long)blk->capacity, overlay,
			 blk->ov->chunk_size >> 10);
		return 0;
	}
	r = evloop_add(host->loop, blk->be.efd, EPOLLIN, on_completion, blk);
	if (r) {
		log_err(log, "disk %s: cannot watch io_uring completions: %s", path, strerror(-r));
		goto fail_mmio;
	}
	blk->watched = true;
	log_info(log, "disk %s: %llu sectors%s at 0x%llx irq %u", path,
		 (unsigned long long)blk->capacity, read_only ? " (read-only)" : "",
		 (unsigned long long)base, irq);
	return 0;
fail_mmio:
	virtio_mmio_destroy(&blk->mmio);
fail_be:
	close_backend(blk);
	return r;
}

void virtio_blk_poll(struct virtio_blk *blk)
{
	on_completion(blk, EPOLLIN);
}

void virtio_blk_destroy(struct virtio_blk *blk)
{
	if (blk->watched)
		evloop_del(blk->host->loop, blk->be.efd);
	blk->watched = false;
	if (blk->rate_tfd >= 0) {
		evloop_del(blk->host->loop, blk->rate_tfd);
		close(blk->rate_tfd);
		blk->rate_tfd = -1;
	}
	/* Requests still in flight complete with -ECANCELED and are only freed. */
	free(blk->ov_req);
	blk->ov_req = NULL;
	close_backend(blk);
	virtio_mmio_destroy(&blk->mmio);
}

void virtio_blk_quiesce(struct virtio_blk *blk)
{
	pthread_mutex_lock(&blk->mmio.lock);
	uint16_t before = blk->mmio.queues[0].used_idx;
	uint64_t all = UINT64_MAX;
	bool pushed = false;
	overlay_continue(blk, &all, &pushed); /* the saved state must not hold half a request */
	blk_uring_drain(&blk->be);
	if (blk->mmio.queues[0].used_idx != before)
		virtio_mmio_notify_used(&blk->mmio, 0);
	pthread_mutex_unlock(&blk->mmio.lock);
}

int virtio_blk_freeze(struct virtio_blk *blk, const char *new_top, int *frozen, char *err,
		      size_t errlen)
{
	*frozen = 0;
	if (!blk->ov)
		return 0;
	pthread_mutex_lock(&blk->mmio.lock);
	bool has_data = false;
	for (size_t i = 0; i < blk->ov->bitmap_bytes && !has_data; i++)
		has_data = blk->ov->bitmap[i] != 0;
	int r = 0;
	if (has_data) {
		r = overlay_freeze(blk->ov, new_top, err, errlen);
		*frozen = r == 0;
	}
	pthread_mutex_unlock(&blk->mmio.lock);
	return r;
}

int virtio_blk_merge_install(struct virtio_blk *blk, struct overlay_merged *m, char *err,
			     size_t errlen)
{
	if (!blk->ov)
		return errmsg(err, errlen, -ESTALE, "disk has no overlay");
	pthread_mutex_lock(&blk->mmio.lock);
	int r = overlay_merge_install(blk->ov, m, err, errlen);
	if (!r) {
		r = overlay_flush(blk->ov);
		if (r)
			errmsg(err, errlen, r, "overlay: writing the top's map after a merge: %s",
			       strerror(-r));
	}
	pthread_mutex_unlock(&blk->mmio.lock);
	return r;
}

static int blk_type_create(void *dev, const struct device_host *h, const void *cfg)
{
	const struct virtio_blk_cfg *c = cfg;
	char serial[VIRTIO_BLK_ID_BYTES + 1];
	snprintf(serial, sizeof(serial), "cove-vd%c", 'a' + h->index);
	const char *layers[BOARD_DISK_LAYERS];
	int nl = c->chain ? c->chain->n : 0;
	for (int k = 0; k < nl && k < BOARD_DISK_LAYERS; k++)
		layers[k] = c->chain->paths[k];
	int r = virtio_blk_create(dev, h->host, c->disk->path, c->disk->read_only,
				  c->disk->overlay[0] ? c->disk->overlay : NULL, layers, nl,
				  h->mmio_base, h->irq, serial);
	if (!r && (r = virtio_blk_set_rate(dev, &c->disk->rate)))
		virtio_blk_destroy(dev);
	return r;
}

static void blk_type_destroy(void *dev)
{
	virtio_blk_destroy(dev);
}

static void blk_type_quiesce(void *dev)
{
	virtio_blk_quiesce(dev);
}

static struct virtio_mmio *blk_type_mmio(void *dev)
{
	return &((struct virtio_blk *)dev)->mmio;
}

/* Disks keep their --disk option and "disks" machine config keys (restore matches host paths). */
const struct device_type virtio_blk_type = {
    .name = "virtio-blk",
    .size = sizeof(struct virtio_blk),
    .create = blk_type_create,
    .destroy = blk_type_destroy,
    .mmio = blk_type_mmio,
    .quiesce = blk_type_quiesce,
};
