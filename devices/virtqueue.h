/* Split virtqueue (virtio 1.x): pure functions over guest memory, shared by every virtio device. */
#ifndef COVE_VIRTQUEUE_H
#define COVE_VIRTQUEUE_H

#include <stdbool.h>
#include <stdint.h>

#include "vmm/guest_mem.h"

#define VIRTQ_MAX_SIZE 256
/* A chain never has more data segments than the largest queue has descriptors. */
#define VIRTQ_MAX_SEGS VIRTQ_MAX_SIZE

#define VIRTQ_DESC_F_NEXT	   1
#define VIRTQ_DESC_F_WRITE	   2
#define VIRTQ_DESC_F_INDIRECT	   4
#define VIRTQ_AVAIL_F_NO_INTERRUPT 1

/* Called for every range of guest memory the virtqueue code writes (used ring, avail_event). */
typedef void (*virtq_dirty_fn)(void *opaque, uint64_t gpa, uint64_t len);

struct virtq {
	/* Set by the transport from the driver's registers and negotiated features. */
	uint16_t size; /* power of two, 1..VIRTQ_MAX_SIZE */
	bool ready;
	uint64_t desc_gpa, avail_gpa, used_gpa;
	bool event_idx; /* VIRTIO_RING_F_EVENT_IDX negotiated */
	bool indirect;	/* VIRTIO_RING_F_INDIRECT_DESC negotiated */
	const struct guest_mem *mem;
	virtq_dirty_fn mark_dirty;
	void *dirty_opaque;

	/* Device-side ring state. */
	uint16_t last_avail;	 /* next avail ring entry to consume */
	uint16_t used_idx;	 /* our copy of used->idx */
	uint16_t signalled_used; /* used_idx when the driver was last interrupted */
	bool signalled_valid;
};

struct virtq_seg {
	uint64_t gpa;
	uint32_t len;
	bool write; /* device writes into it */
};

/* One descriptor chain: readable segments first, then writable ones. */
struct virtq_chain {
	uint16_t head;
	uint32_t nr;
	uint32_t nr_out;  /* leading readable segments */
	uint64_t out_len; /* bytes the device may read */
	uint64_t in_len;  /* bytes the device may write */
	struct virtq_seg seg[VIRTQ_MAX_SEGS];
};

/* Checks the ring addresses against guest memory and alignment. 0 or -EINVAL. */
int virtq_check_layout(const struct virtq *q);
/* Clears the device-side state (queue reset); keeps mem/mark_dirty. */
void virtq_reset(struct virtq *q);
/*
 * Takes the next available chain.  Returns 1 with `c` filled, 0 when the ring
 * is empty, -EINVAL when the chain at the head is malformed (c->head is then
 * set, the entry is consumed; the device fails the request or needs a reset),
 * -EIO when the ring itself is broken (bad avail index or ring address).
 * Never touches memory outside guest RAM and always terminates.
 */
int virtq_pop(struct virtq *q, struct virtq_chain *c);
/* The driver's avail index (how many buffers it has ever made available): 0, or -EIO. */
int virtq_avail_idx(const struct virtq *q, uint16_t *idx);
/* Asks the driver to notify when it makes the next buffer available (with EVENT_IDX it may
 * otherwise stay silent): 0, or -EIO. */
int virtq_notify_on_next_avail(struct virtq *q);
/* Puts `head` on the used ring with `len` bytes written. 0 or -EIO. */
int virtq_push(struct virtq *q, uint16_t head, uint32_t len);
/* After pushes: must the driver be interrupted (EVENT_IDX / NO_INTERRUPT)? */
bool virtq_should_notify(struct virtq *q);
/* vring_need_event() of the spec: did new_idx move past event since old_idx? */
static inline bool virtq_need_event(uint16_t event, uint16_t new_idx, uint16_t old_idx)
{
	return (uint16_t)(new_idx - event - 1) < (uint16_t)(new_idx - old_idx);
}
/* Copies up to `len` bytes from the readable segments starting at byte `off`; returns bytes copied.
 */
uint64_t virtq_chain_read(const struct virtq *q, const struct virtq_chain *c, uint64_t off,
			  void *buf, uint64_t len);

#endif
