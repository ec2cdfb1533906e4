/* Unit tests: split virtqueue, virtio-mmio registers, over fake guest memory, hostile chains. */
#include "helpers.h"
#include "vmm/guest_mem.h"
#include "devices/virtio_mmio.h"
#include "devices/virtqueue.h"
#include "host_fake.h"

#define MEM_SIZE (4ULL << 20)
#define DESC	 0x1000ULL
#define AVAIL	 0x2000ULL
#define USED	 0x3000ULL
#define IND	 0x4000ULL
#define DATA	 0x10000ULL
#define QSIZE	 16

struct dirty_range {
	uint64_t gpa, len;
};

struct fixture {
	struct guest_mem mem;
	struct virtq q;
	struct virtq_chain c;
	struct dirty_range dirty[256];
	int nr_dirty;
};

static void record_dirty(void *opaque, uint64_t gpa, uint64_t len)
{
	struct fixture *f = opaque;
	if (f->nr_dirty < 256)
		f->dirty[f->nr_dirty++] = (struct dirty_range){gpa, len};
}

static bool was_marked(struct fixture *f, uint64_t gpa, uint64_t len)
{
	for (int i = 0; i < f->nr_dirty; i++)
		if (f->dirty[i].gpa <= gpa && gpa + len <= f->dirty[i].gpa + f->dirty[i].len)
			return true;
	return false;
}

static uint8_t *gp(struct fixture *f, uint64_t gpa)
{
	return guest_mem_ptr(&f->mem, gpa, 1);
}

static void set_desc_at(struct fixture *f, uint64_t table, uint32_t i, uint64_t addr, uint32_t len,
			uint16_t flags, uint16_t next)
{
	write_desc(gp(f, table + 16ULL * i), addr, len, flags, next);
}

static void set_desc(struct fixture *f, uint32_t i, uint64_t addr, uint32_t len, uint16_t flags,
		     uint16_t next)
{
	set_desc_at(f, DESC, i, addr, len, flags, next);
}

static uint16_t rd16(struct fixture *f, uint64_t gpa)
{
	uint16_t v;
	memcpy(&v, gp(f, gpa), 2);
	return v;
}

static void wr16(struct fixture *f, uint64_t gpa, uint16_t v)
{
	memcpy(gp(f, gpa), &v, 2);
}

/* Puts `head` on the avail ring and bumps avail->idx. */
static void offer(struct fixture *f, uint16_t head)
{
	uint16_t idx = rd16(f, AVAIL + 2);
	wr16(f, AVAIL + 4 + 2ULL * (idx % f->q.size), head);
	wr16(f, AVAIL + 2, (uint16_t)(idx + 1));
}

/*
 * Pops the chain at `head`: three segments, the first (16 bytes) readable, `in_len` bytes the
 * device may write, the last segment at `last_gpa`.
 */
static void pop_3_segments(struct fixture *f, uint16_t head, uint64_t in_len, uint64_t last_gpa)
{
	assert_int_equal(virtq_pop(&f->q, &f->c), 1);
	assert_int_equal(f->c.head, head);
	assert_int_equal(f->c.nr, 3);
	assert_int_equal(f->c.nr_out, 1);
	assert_int_equal(f->c.out_len, 16);
	assert_int_equal(f->c.in_len, in_len);
	assert_int_equal(f->c.seg[2].gpa, last_gpa);
}

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	assert_non_null(f);
	assert_int_equal(guest_mem_create(&f->mem, MEM_SIZE), 0);
	f->q = (struct virtq){.size = QSIZE,
			      .desc_gpa = DESC,
			      .avail_gpa = AVAIL,
			      .used_gpa = USED,
			      .indirect = true,
			      .mem = &f->mem,
			      .mark_dirty = record_dirty,
			      .dirty_opaque = f};
	assert_int_equal(virtq_check_layout(&f->q), 0);
	f->q.ready = true;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	guest_mem_destroy(&f->mem);
	free(f);
	return 0;
}

static void test_simple_chain(void **state)
{
	struct fixture *f = *state;
	assert_int_equal(virtq_pop(&f->q, &f->c), 0); /* empty */
	set_desc(f, 3, DATA, 16, VIRTQ_DESC_F_NEXT, 7);
	set_desc(f, 7, DATA + 0x1000, 4096, VIRTQ_DESC_F_NEXT | VIRTQ_DESC_F_WRITE, 2);
	set_desc(f, 2, DATA + 0x3000, 1, VIRTQ_DESC_F_WRITE, 0);
	offer(f, 3);
	pop_3_segments(f, 3, 4097, DATA + 0x3000);
	assert_true(f->c.seg[1].write);
	assert_int_equal(virtq_pop(&f->q, &f->c), 0);

	/* chain_read gathers the readable bytes across segments. */
	set_desc(f, 0, DATA, 3, VIRTQ_DESC_F_NEXT, 1);
	set_desc(f, 1, DATA + 0x100, 13, 0, 0);
	memcpy(gp(f, DATA), "abc", 3);
	memcpy(gp(f, DATA + 0x100), "defghijklmnop", 13);
	offer(f, 0);
	assert_int_equal(virtq_pop(&f->q, &f->c), 1);
	char buf[17] = {0};
	assert_int_equal(virtq_chain_read(&f->q, &f->c, 0, buf, 16), 16);
	assert_string_equal(buf, "abcdefghijklmnop");
	memset(buf, 0, sizeof(buf));
	assert_int_equal(virtq_chain_read(&f->q, &f->c, 2, buf, 100), 14);
	assert_string_equal(buf, "cdefghijklmnop");
}

/* Offers one chain starting at `head` and expects it to be rejected, then a good one to work. */
static void expect_bad(struct fixture *f, uint16_t head)
{
	offer(f, head);
	assert_int_equal(virtq_pop(&f->q, &f->c), -EINVAL);
	/* The bad entry is consumed; the ring goes on. */
	set_desc(f, 15, DATA, 16, 0, 0);
	offer(f, 15);
	assert_int_equal(virtq_pop(&f->q, &f->c), 1);
	assert_int_equal(f->c.head, 15);
}

static void test_malformed_direct(void **state)
{
	struct fixture *f = *state;
	/* loop of two */
	set_desc(f, 0, DATA, 16, VIRTQ_DESC_F_NEXT, 1);
	set_desc(f, 1, DATA, 16, VIRTQ_DESC_F_NEXT, 0);
	expect_bad(f, 0);
	/* self loop */
	set_desc(f, 2, DATA, 16, VIRTQ_DESC_F_NEXT, 2);
	expect_bad(f, 2);
	/* next out of range */
	set_desc(f, 3, DATA, 16, VIRTQ_DESC_F_NEXT, QSIZE);
	expect_bad(f, 3);
	set_desc(f, 3, DATA, 16, VIRTQ_DESC_F_NEXT, 0xffff);
	expect_bad(f, 3);
	/* head out of range */
	expect_bad(f, QSIZE);
	expect_bad(f, 0xffff);
	/* zero length */
	set_desc(f, 4, DATA, 0, 0, 0);
	expect_bad(f, 4);
	/* buffer past the end of RAM, straddling it, wrapping, in the MMIO hole */
	set_desc(f, 5, MEM_SIZE, 16, 0, 0);
	expect_bad(f, 5);
	set_desc(f, 5, MEM_SIZE - 8, 16, 0, 0);
	expect_bad(f, 5);
	set_desc(f, 5, 0xfffffffffffffff0ULL, 0x20, 0, 0);
	expect_bad(f, 5);
	set_desc(f, 5, DATA, 0xffffffff, 0, 0);
	expect_bad(f, 5);
	set_desc(f, 5, 0xd0000000ULL, 16, 0, 0);
	expect_bad(f, 5);
	/* readable after writable */
	set_desc(f, 6, DATA, 16, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT, 7);
	set_desc(f, 7, DATA, 16, 0, 0);
	expect_bad(f, 6);
	/* the longest loop-free chain is fine, a longer one is a loop */
	for (uint16_t i = 0; i < QSIZE - 1; i++)
		set_desc(f, i, DATA, 16, VIRTQ_DESC_F_NEXT, (uint16_t)(i + 1));
	set_desc(f, QSIZE - 1, DATA, 16, 0, 0);
	offer(f, 0);
	assert_int_equal(virtq_pop(&f->q, &f->c), 1);
	assert_int_equal(f->c.nr, QSIZE);
	set_desc(f, QSIZE - 1, DATA, 16, VIRTQ_DESC_F_NEXT, 0);
	offer(f, 0);
	assert_int_equal(virtq_pop(&f->q, &f->c), -EINVAL);
}

static void test_broken_ring(void **state)
{
	struct fixture *f = *state;
	/* The driver claims more new entries than the ring has. */
	wr16(f, AVAIL + 2, QSIZE + 1);
	assert_int_equal(virtq_pop(&f->q, &f->c), -EIO);
	wr16(f, AVAIL + 2, 0xffff);
	assert_int_equal(virtq_pop(&f->q, &f->c), -EIO);
	/* Exactly a full ring is legal. */
	wr16(f, AVAIL + 2, QSIZE);
	for (int i = 0; i < QSIZE; i++)
		wr16(f, AVAIL + 4 + 2ULL * i, 0);
	set_desc(f, 0, DATA, 16, 0, 0);
	for (int i = 0; i < QSIZE; i++)
		assert_int_equal(virtq_pop(&f->q, &f->c), 1);
	assert_int_equal(virtq_pop(&f->q, &f->c), 0);
	/* A ring that was moved out of RAM behind our back. */
	f->q.used_gpa = MEM_SIZE - 8;
	assert_int_equal(virtq_pop(&f->q, &f->c), -EIO);
	assert_int_equal(virtq_push(&f->q, 0, 0), -EIO);
}

static void test_indirect(void **state)
{
	struct fixture *f = *state;
	set_desc_at(f, IND, 0, DATA, 16, VIRTQ_DESC_F_NEXT, 2);
	set_desc_at(f, IND, 2, DATA + 0x1000, 512, VIRTQ_DESC_F_NEXT | VIRTQ_DESC_F_WRITE, 1);
	set_desc_at(f, IND, 1, DATA + 0x2000, 1, VIRTQ_DESC_F_WRITE, 0);
	set_desc(f, 0, IND, 3 * 16, VIRTQ_DESC_F_INDIRECT, 0);
	offer(f, 0);
	pop_3_segments(f, 0, 513, DATA + 0x2000);

	/* not negotiated */
	f->q.indirect = false;
	expect_bad(f, 0);
	f->q.indirect = true;
	/* misaligned table */
	set_desc(f, 1, IND + 8, 3 * 16, VIRTQ_DESC_F_INDIRECT, 0);
	expect_bad(f, 1);
	/* length not a multiple of a descriptor, zero, larger than the queue */
	set_desc(f, 1, IND, 3 * 16 + 4, VIRTQ_DESC_F_INDIRECT, 0);
	expect_bad(f, 1);
	set_desc(f, 1, IND, 0, VIRTQ_DESC_F_INDIRECT, 0);
	expect_bad(f, 1);
	set_desc(f, 1, IND, (QSIZE + 1) * 16, VIRTQ_DESC_F_INDIRECT, 0);
	expect_bad(f, 1);
	/* table outside RAM */
	set_desc(f, 1, MEM_SIZE - 16, 32, VIRTQ_DESC_F_INDIRECT, 0);
	expect_bad(f, 1);
	/* INDIRECT together with NEXT */
	set_desc(f, 1, IND, 3 * 16, VIRTQ_DESC_F_INDIRECT | VIRTQ_DESC_F_NEXT, 2);
	set_desc(f, 2, DATA, 1, VIRTQ_DESC_F_WRITE, 0);
	expect_bad(f, 1);
	/* indirect after a direct descriptor */
	set_desc(f, 1, DATA, 16, VIRTQ_DESC_F_NEXT, 2);
	set_desc(f, 2, IND, 3 * 16, VIRTQ_DESC_F_INDIRECT, 0);
	expect_bad(f, 1);
	/* nested indirect */
	set_desc_at(f, IND + 0x100, 0, IND, 3 * 16, VIRTQ_DESC_F_INDIRECT, 0);
	set_desc(f, 1, IND + 0x100, 16, VIRTQ_DESC_F_INDIRECT, 0);
	expect_bad(f, 1);
	/* loop inside the table, index outside it */
	set_desc_at(f, IND + 0x200, 0, DATA, 16, VIRTQ_DESC_F_NEXT, 1);
	set_desc_at(f, IND + 0x200, 1, DATA, 16, VIRTQ_DESC_F_NEXT, 0);
	set_desc(f, 1, IND + 0x200, 2 * 16, VIRTQ_DESC_F_INDIRECT, 0);
	expect_bad(f, 1);
	set_desc_at(f, IND + 0x200, 1, DATA, 16, VIRTQ_DESC_F_NEXT, 2);
	expect_bad(f, 1);
	/* bad buffers inside the table */
	set_desc_at(f, IND + 0x200, 0, DATA, 0, 0, 0);
	expect_bad(f, 1);
	set_desc_at(f, IND + 0x200, 0, DATA, 16, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT, 1);
	set_desc_at(f, IND + 0x200, 1, DATA, 16, 0, 0);
	expect_bad(f, 1);
	set_desc_at(f, IND + 0x200, 0, MEM_SIZE, 16, 0, 0);
	expect_bad(f, 1);
}

static void test_push_marks_dirty(void **state)
{
	struct fixture *f = *state;
	set_desc(f, 5, DATA, 16, 0, 0);
	offer(f, 5);
	assert_int_equal(virtq_pop(&f->q, &f->c), 1);
	f->nr_dirty = 0;
	assert_int_equal(virtq_push(&f->q, 5, 77), 0);
	assert_int_equal(rd16(f, USED + 2), 1);
	uint32_t e[2];
	memcpy(e, gp(f, USED + 4), 8);
	assert_int_equal(e[0], 5);
	assert_int_equal(e[1], 77);
	assert_true(was_marked(f, USED + 2, 2));
	assert_true(was_marked(f, USED + 4, 8));
	/* wraps around the ring */
	for (int i = 0; i < QSIZE; i++)
		assert_int_equal(virtq_push(&f->q, (uint16_t)i, 0), 0);
	assert_int_equal(rd16(f, USED + 2), QSIZE + 1);
	memcpy(e, gp(f, USED + 4), 8);
	assert_int_equal(e[0], QSIZE - 1);
	assert_true(was_marked(f, USED + 4 + 8 * (QSIZE - 1), 8));
}

static void test_event_idx(void **state)
{
	struct fixture *f = *state;
	/* vring_need_event: interrupt when used moved past used_event since the last one. */
	assert_true(virtq_need_event(0, 1, 0));
	assert_false(virtq_need_event(1, 1, 0));
	assert_true(virtq_need_event(1, 2, 0));
	assert_false(virtq_need_event(5, 3, 0));
	assert_true(virtq_need_event(0xffff, 0, 0xfffe)); /* across the wrap */
	assert_false(virtq_need_event(0, 0, 0xfffe));
	assert_true(virtq_need_event(0xfffe, 2, 0xfffd));

	/* Without EVENT_IDX: NO_INTERRUPT in avail->flags suppresses. */
	assert_true(virtq_should_notify(&f->q));
	wr16(f, AVAIL, VIRTQ_AVAIL_F_NO_INTERRUPT);
	assert_false(virtq_should_notify(&f->q));
	wr16(f, AVAIL, 0);

	f->q.event_idx = true;
	uint64_t used_event = AVAIL + 4 + 2 * QSIZE;
	uint64_t avail_event = USED + 4 + 8 * QSIZE;
	/* An empty pop publishes avail_event = where we will look next, and marks it dirty. */
	f->nr_dirty = 0;
	wr16(f, avail_event, 0x5555);
	assert_int_equal(virtq_pop(&f->q, &f->c), 0);
	assert_int_equal(rd16(f, avail_event), 0);
	assert_true(was_marked(f, avail_event, 2));
	set_desc(f, 0, DATA, 16, 0, 0);
	offer(f, 0);
	offer(f, 0);
	assert_int_equal(virtq_pop(&f->q, &f->c), 1);
	assert_int_equal(virtq_pop(&f->q, &f->c), 1);
	assert_int_equal(virtq_pop(&f->q, &f->c), 0);
	assert_int_equal(rd16(f, avail_event), 2);

	/* First interrupt always goes; then only when used passes used_event. */
	wr16(f, used_event, 0);
	virtq_push(&f->q, 0, 0); /* used 1 */
	assert_true(virtq_should_notify(&f->q));
	wr16(f, used_event, 2);	 /* driver wants to hear when entry 2 is used (idx becomes 3) */
	virtq_push(&f->q, 0, 0); /* used 2 */
	assert_false(virtq_should_notify(&f->q));
	virtq_push(&f->q, 0, 0); /* used 3 */
	assert_true(virtq_should_notify(&f->q));
	virtq_push(&f->q, 0, 0); /* used 4: event 2 already signalled */
	assert_false(virtq_should_notify(&f->q));
	/* A batch that jumps over used_event still notifies. */
	wr16(f, used_event, 5);
	virtq_push(&f->q, 0, 0);
	virtq_push(&f->q, 0, 0);
	virtq_push(&f->q, 0, 0); /* used 7 */
	assert_true(virtq_should_notify(&f->q));
}

static void test_layout_checks(void **state)
{
	struct fixture *f = *state;
	struct virtq q = f->q;
	q.size = 3;
	assert_int_equal(virtq_check_layout(&q), -EINVAL);
	q.size = 0;
	assert_int_equal(virtq_check_layout(&q), -EINVAL);
	q.size = VIRTQ_MAX_SIZE * 2;
	assert_int_equal(virtq_check_layout(&q), -EINVAL);
	q = f->q;
	q.desc_gpa = DESC + 8;
	assert_int_equal(virtq_check_layout(&q), -EINVAL);
	q = f->q;
	q.avail_gpa = AVAIL + 1;
	assert_int_equal(virtq_check_layout(&q), -EINVAL);
	q = f->q;
	q.used_gpa = USED + 2;
	assert_int_equal(virtq_check_layout(&q), -EINVAL);
	q = f->q;
	q.used_gpa = MEM_SIZE - 16;
	assert_int_equal(virtq_check_layout(&q), -EINVAL);
	q = f->q;
	q.desc_gpa = 0xfffffffffffff000ULL;
	assert_int_equal(virtq_check_layout(&q), -EINVAL);
}

/* Random descriptor tables and rings: pop must always terminate, stay in RAM, and keep its
 * invariants. */
static void test_random_chains(void **state)
{
	struct fixture *f = *state;
	uint64_t seed = 0x9e3779b97f4a7c15ULL;
	int good = 0, bad = 0;
	for (int round = 0; round < 20000; round++) {
		for (int i = 0; i < 12; i++) {
			seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
			uint64_t r = seed >> 16;
			uint16_t i16 = (uint16_t)(r % (QSIZE + 2));
			uint64_t addr =
			    (r & 1) ? DATA + ((r >> 8) & 0xfff0) : (r >> 3) % (MEM_SIZE + 0x1000);
			if ((r & 0xf) == 3)
				addr = IND;
			uint32_t len = (uint32_t)((r >> 20) % 80);
			if ((r & 0x70) == 0x10)
				len = (uint32_t)(r >> 5);
			uint16_t flags = (uint16_t)((r >> 40) & 7);
			if (i16 < QSIZE)
				set_desc(f, i16, addr, len, flags,
					 (uint16_t)((r >> 44) % (QSIZE + 1)));
			set_desc_at(f, IND, (uint32_t)((r >> 50) % 8), addr, len, flags,
				    (uint16_t)((r >> 54) % 9));
		}
		offer(f, (uint16_t)((seed >> 33) % (QSIZE + 1)));
		int r = virtq_pop(&f->q, &f->c);
		assert_true(r == 1 || r == -EINVAL);
		bad += r != 1;
		if (r == 1) {
			good++;
			assert_true(f->c.nr >= 1 && f->c.nr <= VIRTQ_MAX_SEGS);
			for (uint32_t s = 0; s < f->c.nr; s++) {
				assert_non_null(
				    guest_mem_ptr(&f->mem, f->c.seg[s].gpa, f->c.seg[s].len));
				assert_true(f->c.seg[s].write == (s >= f->c.nr_out));
			}
			assert_int_equal(virtq_push(&f->q, f->c.head, 0), 0);
		}
	}
	/* Both outcomes were exercised. */
	assert_true(good > 100 && bad > 100);
}

/* ---- virtio-mmio registers (no VM: no eventfds, the bus handlers are called directly) ---- */

struct fake_dev {
	int notified;
	int resets;
	uint8_t config[8];
};

static void fake_config_read(void *dev, uint32_t off, uint8_t *data, uint32_t len)
{
	memcpy(data, ((struct fake_dev *)dev)->config + off, len);
}

static void fake_notify(void *dev, struct virtio_mmio *t, uint32_t q)
{
	(void)t;
	(void)q;
	((struct fake_dev *)dev)->notified++;
}

static void fake_reset(void *dev)
{
	((struct fake_dev *)dev)->resets++;
}

static const struct virtio_dev_ops fake_ops = {
    .name = "fake",
    .device_id = 42,
    .features = VIRTIO_F_RING_EVENT_IDX | 1,
    .nr_queues = 1,
    .config_size = 8,
    .config_read = fake_config_read,
    .queue_notify = fake_notify,
    .reset = fake_reset,
};

static uint32_t mmio_rd(struct virtio_mmio *t, uint64_t off)
{
	uint32_t v;
	virtio_mmio_read(t, off, (uint8_t *)&v, 4);
	return v;
}

static void mmio_wr(struct virtio_mmio *t, uint64_t off, uint32_t v)
{
	virtio_mmio_write(t, off, (const uint8_t *)&v, 4);
}

static void test_mmio_registers(void **state)
{
	struct fixture *f = *state;
	struct fake_dev dev = {.config = {1, 2, 3, 4, 5, 6, 7, 8}};
	struct virtio_mmio t;
	struct host_fake hf;
	assert_int_equal(host_fake_init(&hf, &f->mem), 0);
	assert_int_equal(virtio_mmio_create(&t, &hf.host, VIRTIO_MMIO_BASE, 5, &fake_ops, &dev), 0);
	assert_int_equal(mmio_rd(&t, 0x000), 0x74726976);
	assert_int_equal(mmio_rd(&t, 0x004), 2);
	assert_int_equal(mmio_rd(&t, 0x008), 42);
	mmio_wr(&t, 0x014, 0);
	assert_int_equal(mmio_rd(&t, 0x010), (uint32_t)(VIRTIO_F_RING_EVENT_IDX | 1));
	mmio_wr(&t, 0x014, 1);
	assert_int_equal(mmio_rd(&t, 0x010), 1); /* VERSION_1 */
	uint8_t b = 0;
	virtio_mmio_read(&t, 0x102, &b, 1);
	assert_int_equal(b, 3);
	uint32_t w = 0xdead;
	virtio_mmio_read(&t, 0x106, (uint8_t *)&w, 4); /* runs past config space: zeros */
	assert_int_equal(w, 0);

	/* FEATURES_OK refused without VERSION_1, and for features never offered. */
	mmio_wr(&t, 0x070, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER);
	mmio_wr(&t, 0x024, 0);
	mmio_wr(&t, 0x020, 1);
	mmio_wr(&t, 0x070,
		VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_FEATURES_OK);
	assert_false(mmio_rd(&t, 0x070) & VIRTIO_STATUS_FEATURES_OK);
	mmio_wr(&t, 0x024, 1);
	mmio_wr(&t, 0x020, 1 | 2); /* bit 33 was not offered */
	mmio_wr(&t, 0x070,
		VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_FEATURES_OK);
	assert_false(mmio_rd(&t, 0x070) & VIRTIO_STATUS_FEATURES_OK);
	mmio_wr(&t, 0x020, 1);
	mmio_wr(&t, 0x024, 0);
	mmio_wr(&t, 0x020, (uint32_t)VIRTIO_F_RING_EVENT_IDX);
	mmio_wr(&t, 0x070,
		VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_FEATURES_OK);
	assert_true(mmio_rd(&t, 0x070) & VIRTIO_STATUS_FEATURES_OK);

	/* Queue 0 set-up; a queue that does not exist reads as absent. */
	mmio_wr(&t, 0x030, 1);
	assert_int_equal(mmio_rd(&t, 0x034), 0);
	mmio_wr(&t, 0x030, 0);
	assert_int_equal(mmio_rd(&t, 0x034), VIRTQ_MAX_SIZE);
	mmio_wr(&t, 0x038, QSIZE);
	mmio_wr(&t, 0x080, (uint32_t)DESC);
	mmio_wr(&t, 0x084, 0);
	mmio_wr(&t, 0x090, (uint32_t)AVAIL);
	mmio_wr(&t, 0x0a0, (uint32_t)USED);
	mmio_wr(&t, 0x044, 1);
	assert_int_equal(mmio_rd(&t, 0x044), 1);
	assert_true(t.queues[0].event_idx);
	assert_false(t.queues[0].indirect);
	mmio_wr(&t, 0x050, 0); /* no DRIVER_OK yet: ignored */
	assert_int_equal(dev.notified, 0);
	mmio_wr(&t, 0x070,
		VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_FEATURES_OK |
		    VIRTIO_STATUS_DRIVER_OK);
	mmio_wr(&t, 0x050, 0);
	assert_int_equal(dev.notified, 1);
	mmio_wr(&t, 0x050, 7); /* no such queue */
	assert_int_equal(dev.notified, 1);
	/* Layout registers are frozen while the queue is ready. */
	mmio_wr(&t, 0x080, 0x8000);
	assert_int_equal(t.queues[0].desc_gpa, DESC);

	/* Interrupt status and ack. */
	virtio_mmio_notify_used(&t, 0);
	assert_int_equal(mmio_rd(&t, 0x060), VIRTIO_INT_USED);
	mmio_wr(&t, 0x064, VIRTIO_INT_USED);
	assert_int_equal(mmio_rd(&t, 0x060), 0);

	/* Reset clears everything and tells the device. */
	mmio_wr(&t, 0x070, 0);
	assert_int_equal(dev.resets, 1);
	assert_int_equal(mmio_rd(&t, 0x070), 0);
	assert_int_equal(mmio_rd(&t, 0x044), 0);

	/* A ring outside RAM: the device asks for a reset instead of using it. */
	mmio_wr(&t, 0x024, 1);
	mmio_wr(&t, 0x020, 1);
	mmio_wr(&t, 0x070,
		VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_FEATURES_OK);
	mmio_wr(&t, 0x038, QSIZE);
	mmio_wr(&t, 0x080, (uint32_t)DESC);
	mmio_wr(&t, 0x090, (uint32_t)AVAIL);
	mmio_wr(&t, 0x0a0, 0xfffff000);
	mmio_wr(&t, 0x044, 1);
	assert_int_equal(mmio_rd(&t, 0x044), 0);
	assert_true(mmio_rd(&t, 0x070) & VIRTIO_STATUS_NEEDS_RESET);
	/* Non-32-bit register accesses are ignored. */
	uint16_t h = 0xffff;
	virtio_mmio_read(&t, 0x000, (uint8_t *)&h, 2);
	assert_int_equal(h, 0);
	virtio_mmio_destroy(&t);
	host_fake_destroy(&hf);
}

static void test_mmio_cmdline(void **state)
{
	(void)state;
	struct virtio_mmio a = {.base = 0xd0000000, .irq = 5}, b = {.base = 0xd0001000, .irq = 6};
	struct virtio_mmio *devs[] = {&a, &b};
	char buf[4096] = "console=ttyS0";
	assert_int_equal(virtio_mmio_cmdline_append(devs, 2, buf, sizeof(buf)), 0);
	assert_string_equal(buf, "console=ttyS0 virtio_mmio.device=4K@0xd0000000:5 "
				 "virtio_mmio.device=4K@0xd0001000:6");
	buf[0] = 0;
	assert_int_equal(virtio_mmio_cmdline_append(devs, 1, buf, sizeof(buf)), 0);
	assert_string_equal(buf, "virtio_mmio.device=4K@0xd0000000:5");
	/* Past 4095 bytes: an error, the text stays a valid string. */
	memset(buf, 'x', 4080);
	buf[4080] = 0;
	assert_int_equal(virtio_mmio_cmdline_append(devs, 1, buf, sizeof(buf)), -E2BIG);
	assert_int_equal(strlen(buf), 4080);
	char small[20] = "abc";
	assert_int_equal(virtio_mmio_cmdline_append(devs, 1, small, sizeof(small)), -E2BIG);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_simple_chain, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_malformed_direct, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_broken_ring, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_indirect, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_push_marks_dirty, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_event_idx, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_layout_checks, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_random_chains, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_mmio_registers, setup, teardown),
	    cmocka_unit_test(test_mmio_cmdline),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
