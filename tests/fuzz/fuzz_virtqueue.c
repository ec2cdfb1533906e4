/*
 * libFuzzer target: the split virtqueue (devices/virtqueue.c) over fake guest memory. The input
 * is a queue setup (size, features, how many chains to take) and the bytes of the rings and the
 * memory around them, as a hostile driver would lay them out.
 */
#include <stdio.h>
#include <stdlib.h>

#include "devices/virtqueue.h"
#include "fuzz.h"
#include "vmm/guest_mem.h"

/* Guest-physical layout; the input is copied to GPA 0, so it writes the rings it wants. */
#define FZ_MEM	 (2ULL << 20)
#define FZ_DESC	 0x0000ULL
#define FZ_AVAIL 0x1000ULL
#define FZ_USED	 0x2000ULL
#define FZ_DIRTY 0x10000ULL /* bytes wiped between inputs: the -max_len cap is below it */
#define FZ_READ	 (64u << 10)

static void check_chain(const struct virtq *q, const struct virtq_chain *c)
{
	uint64_t out = 0, in = 0;
	if (c->nr > VIRTQ_MAX_SEGS || c->nr_out > c->nr)
		abort();
	for (uint32_t i = 0; i < c->nr; i++) {
		const struct virtq_seg *s = &c->seg[i];
		/* Readable segments first, then writable ones, each inside guest RAM. */
		if (s->write != (i >= c->nr_out) || !guest_mem_ptr(q->mem, s->gpa, s->len))
			abort();
		if (s->write)
			in += s->len;
		else
			out += s->len;
	}
	if (out != c->out_len || in != c->in_len)
		abort();
}

static void no_dirty(void *opaque, uint64_t gpa, uint64_t len)
{
	const struct guest_mem *mem = opaque;
	if (!guest_mem_ptr(mem, gpa, len)) /* the queue only writes RAM */
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* One guest memory for the process: a memfd mapping costs more than an input. */
	static struct guest_mem mem;
	static bool have_mem;
	static struct virtq_chain c;
	static uint8_t buf[FZ_READ];
	if (!have_mem) {
		if (guest_mem_create(&mem, FZ_MEM)) {
			fprintf(stderr, "fuzz_virtqueue: cannot create guest memory\n");
			abort();
		}
		have_mem = true;
	}
	struct fuzz_in in = {data, size};
	uint8_t shape = fuzz_u8(&in), feat = fuzz_u8(&in), pops = fuzz_u8(&in);
	uint8_t *ram = guest_mem_ptr(&mem, 0, FZ_DIRTY);
	memset(ram, 0, FZ_DIRTY);
	size_t got;
	const uint8_t *rest = fuzz_bytes(&in, FZ_DIRTY, &got);
	memcpy(ram, rest, got);

	struct virtq q = {
	    .size = (uint16_t)(1u << (shape % 10)), /* 1..512: 512 is refused by the layout */
	    .ready = true,
	    .desc_gpa = FZ_DESC + ((shape & 0x80) ? 8 : 0), /* sometimes misaligned */
	    .avail_gpa = FZ_AVAIL,
	    .used_gpa = FZ_USED,
	    .event_idx = feat & 1,
	    .indirect = feat & 2,
	    .mem = &mem,
	    .mark_dirty = no_dirty,
	    .dirty_opaque = &mem,
	    .last_avail = (uint16_t)((feat >> 2) * 4099u),
	};
	q.used_idx = q.last_avail;
	if (virtq_check_layout(&q))
		return 0;
	uint16_t idx;
	if (virtq_avail_idx(&q, &idx))
		abort(); /* the layout was checked: the ring is readable */
	for (int i = 0; i < (pops & 63) + 1; i++) {
		int r = virtq_pop(&q, &c);
		if (r == 0)
			break;
		if (r == -EIO)
			break;
		if (r == 1) {
			check_chain(&q, &c);
			uint64_t n = virtq_chain_read(&q, &c, pops >> 6, buf, sizeof(buf));
			if (n > c.out_len)
				abort();
		} else if (r != -EINVAL) {
			abort();
		}
		if (virtq_push(&q, c.head, (uint32_t)c.in_len))
			abort();
		(void)virtq_should_notify(&q);
	}
	if (virtq_notify_on_next_avail(&q))
		abort();
	return 0;
}
