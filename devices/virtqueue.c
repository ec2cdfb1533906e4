/* Split virtqueue: walks the chains the guest offers and fills the used ring, trusting nothing. */
#include "devices/virtqueue.h"

#include <errno.h>
#include <string.h>

/* The rings are little-endian and x86 is too; these structs mirror the spec's layout. */
struct vring_desc {
	uint64_t addr;
	uint32_t len;
	uint16_t flags;
	uint16_t next;
};

struct vring_used_elem {
	uint32_t id;
	uint32_t len;
};

#define AVAIL_RING_OFF 4
#define USED_RING_OFF  4

static uint64_t desc_bytes(uint16_t size)
{
	return 16ULL * size;
}

static uint64_t avail_bytes(uint16_t size)
{
	return 4 + 2ULL * size + 2; /* flags, idx, ring, used_event */
}

static uint64_t used_bytes(uint16_t size)
{
	return 4 + 8ULL * size + 2; /* flags, idx, ring, avail_event */
}

int virtq_check_layout(const struct virtq *q)
{
	if (q->size == 0 || q->size > VIRTQ_MAX_SIZE || (q->size & (q->size - 1)))
		return -EINVAL;
	if ((q->desc_gpa & 15) || (q->avail_gpa & 1) || (q->used_gpa & 3))
		return -EINVAL;
	if (!guest_mem_ptr(q->mem, q->desc_gpa, desc_bytes(q->size)) ||
	    !guest_mem_ptr(q->mem, q->avail_gpa, avail_bytes(q->size)) ||
	    !guest_mem_ptr(q->mem, q->used_gpa, used_bytes(q->size)))
		return -EINVAL;
	return 0;
}

void virtq_reset(struct virtq *q)
{
	q->size = 0;
	q->ready = false;
	q->desc_gpa = q->avail_gpa = q->used_gpa = 0;
	q->event_idx = q->indirect = false;
	q->last_avail = q->used_idx = q->signalled_used = 0;
	q->signalled_valid = false;
}

static void mark(struct virtq *q, uint64_t gpa, uint64_t len)
{
	if (q->mark_dirty)
		q->mark_dirty(q->dirty_opaque, gpa, len);
}

static uint16_t load16(const void *p)
{
	return __atomic_load_n((const uint16_t *)p, __ATOMIC_RELAXED);
}

static void store16(void *p, uint16_t v)
{
	__atomic_store_n((uint16_t *)p, v, __ATOMIC_RELAXED);
}

/* Reads one descriptor: the table is guest memory, so copy it once and use only the copy. */
static void read_desc(const uint8_t *table, uint32_t i, struct vring_desc *d)
{
	memcpy(d, table + 16ULL * i, sizeof(*d));
}

static int add_seg(const struct virtq *q, struct virtq_chain *c, const struct vring_desc *d)
{
	bool w = d->flags & VIRTQ_DESC_F_WRITE;
	if (d->len == 0)
		return -EINVAL;
	/* Every buffer must be RAM in one slot; this also rejects lengths that wrap. */
	if (!guest_mem_ptr(q->mem, d->addr, d->len))
		return -EINVAL;
	if (!w && c->nr > c->nr_out)
		return -EINVAL; /* a readable buffer after a writable one */
	if (c->nr >= VIRTQ_MAX_SEGS)
		return -EINVAL;
	c->seg[c->nr++] = (struct virtq_seg){.gpa = d->addr, .len = d->len, .write = w};
	if (w) {
		c->in_len += d->len;
	} else {
		c->nr_out++;
		c->out_len += d->len;
	}
	/* Bounded by VIRTQ_MAX_SEGS * 4 GiB, so these sums never wrap; cap what devices see anyway.
	 */
	if (c->in_len > UINT32_MAX || c->out_len > UINT32_MAX)
		return -EINVAL;
	return 0;
}

/* Walks an indirect table; nested indirection, loops and bad indexes are errors. */
static int walk_indirect(const struct virtq *q, struct virtq_chain *c, const struct vring_desc *ind)
{
	if (!q->indirect || (ind->flags & VIRTQ_DESC_F_NEXT))
		return -EINVAL;
	if (ind->len == 0 || ind->len % 16 || (ind->addr & 15))
		return -EINVAL;
	uint32_t n = ind->len / 16;
	if (n > q->size)
		return -EINVAL;
	const uint8_t *table = guest_mem_ptr(q->mem, ind->addr, ind->len);
	if (!table)
		return -EINVAL;
	uint32_t i = 0;
	for (uint32_t count = 0;; count++) {
		if (count >= n)
			return -EINVAL; /* more links than entries: a loop */
		struct vring_desc d;
		read_desc(table, i, &d);
		if (d.flags & VIRTQ_DESC_F_INDIRECT)
			return -EINVAL;
		int r = add_seg(q, c, &d);
		if (r)
			return r;
		if (!(d.flags & VIRTQ_DESC_F_NEXT))
			return 0;
		if (d.next >= n)
			return -EINVAL;
		i = d.next;
	}
}

static int walk_chain(const struct virtq *q, struct virtq_chain *c, const uint8_t *table)
{
	uint16_t i = c->head;
	for (uint32_t count = 0;; count++) {
		if (i >= q->size || count >= q->size)
			return -EINVAL; /* out-of-range index, or a loop */
		struct vring_desc d;
		read_desc(table, i, &d);
		if (d.flags & VIRTQ_DESC_F_INDIRECT) {
			/* An indirect table is the whole chain's buffer list. */
			if (c->nr)
				return -EINVAL;
			return walk_indirect(q, c, &d);
		}
		int r = add_seg(q, c, &d);
		if (r)
			return r;
		if (!(d.flags & VIRTQ_DESC_F_NEXT))
			return 0;
		i = d.next;
	}
}

static void set_avail_event(struct virtq *q, uint8_t *used, uint16_t idx)
{
	uint64_t off = USED_RING_OFF + 8ULL * q->size;
	store16(used + off, idx);
	mark(q, q->used_gpa + off, 2);
}

int virtq_avail_idx(const struct virtq *q, uint16_t *idx)
{
	const uint8_t *avail =
	    q->ready ? guest_mem_ptr(q->mem, q->avail_gpa, avail_bytes(q->size)) : NULL;
	if (!avail)
		return -EIO;
	*idx = load16(avail + 2);
	return 0;
}

int virtq_notify_on_next_avail(struct virtq *q)
{
	uint8_t *used = q->ready ? guest_mem_ptr(q->mem, q->used_gpa, used_bytes(q->size)) : NULL;
	uint16_t idx;
	if (!used || virtq_avail_idx(q, &idx))
		return -EIO;
	if (q->event_idx)
		set_avail_event(q, used, idx);
	return 0;
}

int virtq_pop(struct virtq *q, struct virtq_chain *c)
{
	if (!q->ready)
		return 0;
	uint8_t *avail = guest_mem_ptr(q->mem, q->avail_gpa, avail_bytes(q->size));
	uint8_t *used = guest_mem_ptr(q->mem, q->used_gpa, used_bytes(q->size));
	const uint8_t *table = guest_mem_ptr(q->mem, q->desc_gpa, desc_bytes(q->size));
	if (!avail || !used || !table)
		return -EIO;
	uint16_t avail_idx = load16(avail + 2);
	if (avail_idx == q->last_avail) {
		if (!q->event_idx)
			return 0;
		/*
		 * Ask to be notified at the next buffer, then look again: the
		 * driver may have added one before it could see avail_event.
		 */
		set_avail_event(q, used, q->last_avail);
		__atomic_thread_fence(__ATOMIC_SEQ_CST);
		avail_idx = load16(avail + 2);
		if (avail_idx == q->last_avail)
			return 0;
	}
	if ((uint16_t)(avail_idx - q->last_avail) > q->size)
		return -EIO; /* the driver claims more buffers than the ring holds */
	/* Read the ring entry and descriptors only after seeing the index. */
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	uint16_t slot = q->last_avail & (q->size - 1);
	c->head = load16(avail + AVAIL_RING_OFF + 2ULL * slot);
	c->nr = c->nr_out = 0;
	c->in_len = c->out_len = 0;
	q->last_avail++;
	int r = walk_chain(q, c, table);
	return r ? r : 1;
}

int virtq_push(struct virtq *q, uint16_t head, uint32_t len)
{
	uint8_t *used = guest_mem_ptr(q->mem, q->used_gpa, used_bytes(q->size));
	if (!q->ready || !used)
		return -EIO;
	uint64_t off = USED_RING_OFF + 8ULL * (q->used_idx & (q->size - 1));
	struct vring_used_elem e = {.id = head, .len = len};
	memcpy(used + off, &e, sizeof(e));
	mark(q, q->used_gpa + off, sizeof(e));
	/* The element must be visible before the index that publishes it. */
	__atomic_thread_fence(__ATOMIC_RELEASE);
	q->used_idx++;
	store16(used + 2, q->used_idx);
	mark(q, q->used_gpa + 2, 2);
	return 0;
}

bool virtq_should_notify(struct virtq *q)
{
	const uint8_t *avail = guest_mem_ptr(q->mem, q->avail_gpa, avail_bytes(q->size));
	if (!q->ready || !avail)
		return false;
	/* Our used index store must be visible before we read the driver's wishes. */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (!q->event_idx)
		return !(load16(avail) & VIRTQ_AVAIL_F_NO_INTERRUPT);
	uint16_t old = q->signalled_used, new_idx = q->used_idx;
	bool valid = q->signalled_valid;
	q->signalled_used = new_idx;
	q->signalled_valid = true;
	if (!valid)
		return true;
	uint16_t used_event = load16(avail + AVAIL_RING_OFF + 2ULL * q->size);
	return virtq_need_event(used_event, new_idx, old);
}

uint64_t virtq_chain_read(const struct virtq *q, const struct virtq_chain *c, uint64_t off,
			  void *buf, uint64_t len)
{
	uint64_t done = 0;
	for (uint32_t i = 0; i < c->nr_out && done < len; i++) {
		const struct virtq_seg *s = &c->seg[i];
		if (off >= s->len) {
			off -= s->len;
			continue;
		}
		uint64_t n = s->len - off;
		if (n > len - done)
			n = len - done;
		const uint8_t *p = guest_mem_ptr(q->mem, s->gpa + off, n);
		if (!p)
			break;
		memcpy((uint8_t *)buf + done, p, n);
		done += n;
		off = 0;
	}
	return done;
}
