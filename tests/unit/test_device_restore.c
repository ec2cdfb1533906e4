/*
 * Unit tests: every device's restore path fed mutated state structs (fixed-seed random
 * mutations and targeted out-of-range values), each followed by guest port/MMIO access on the
 * restored device, so an unchecked field shows up as an ASan report or a failed assertion.
 */

#include "helpers.h"
#include "snapshot/board_state.h"
#include "devices/cmos_rtc.h"
#include "vmm/guest_mem.h"
#include "devices/i8042.h"
#include "devices/serial.h"
#include "devices/virtio_blk.h"
#include "devices/virtio_mmio.h"
#include "devices/virtio_vsock.h"
#include "host_fake.h"

/* Each test's fake machine (fresh buses, so devices can be created again). */
static struct host_fake hf;
static bool hf_live;

static const struct vm_host *fake_host(const struct guest_mem *mem)
{
	if (hf_live)
		host_fake_destroy(&hf);
	assert_int_equal(host_fake_init(&hf, mem), 0);
	hf_live = true;
	return &hf.host;
}

#define ITERATIONS 4000
#define MEM_SIZE   (4ULL << 20)
#define RING_AREA  0x40000ULL /* guest RAM the rings and buffers of the fuzzed queues sit in */

/* One to four edits: a random byte, a flipped bit, a boundary byte, or a wide random word. */
static void mutate(uint8_t *buf, size_t len, uint64_t *seed)
{
	static const uint8_t edge[] = {0x00, 0x01, 0x7f, 0x80, 0xff, 0x10, 0x11, 0x20};
	int n = 1 + (int)(rnd(seed) % 4);
	for (int i = 0; i < n; i++) {
		size_t off = rnd(seed) % len;
		switch (rnd(seed) % 4) {
		case 0:
			buf[off] = (uint8_t)rnd(seed);
			break;
		case 1:
			buf[off] ^= (uint8_t)(1u << (rnd(seed) % 8));
			break;
		case 2:
			buf[off] = edge[rnd(seed) % sizeof(edge)];
			break;
		default: {
			uint64_t v = rnd(seed);
			size_t w = 1u << (rnd(seed) % 4);
			if (off + w > len)
				off = len - w;
			memcpy(buf + off, &v, w);
		}
		}
	}
}

/* ---- legacy devices: the struct is allocated exactly, so ASan sees any overrun ---- */

static void poke_ports(void (*rd)(void *, uint64_t, uint8_t *, uint32_t),
		       void (*wr)(void *, uint64_t, const uint8_t *, uint32_t), void *dev,
		       uint64_t nports, uint64_t *seed)
{
	uint8_t b[4];
	/* Reads and data writes first: they use the restored state before the guest changes it. */
	for (uint64_t p = 0; p < nports; p++)
		rd(dev, p, b, 1);
	for (uint64_t p = nports; p-- > 0;) {
		b[0] = (uint8_t)rnd(seed);
		wr(dev, p, b, 1);
		rd(dev, p, b, 1);
	}
	for (int i = 0; i < 32; i++) {
		b[0] = (uint8_t)rnd(seed);
		uint64_t p = rnd(seed) % nports;
		if (rnd(seed) & 1)
			wr(dev, p, b, 1);
		else
			rd(dev, p, b, 1);
	}
}

static void test_cmos_restore(void **state)
{
	(void)state;
	uint64_t seed = 0xc0e5;
	char err[256];
	struct cmos_rtc *c = malloc(sizeof(*c));
	assert_non_null(c);
	assert_int_equal(cmos_rtc_create(c, fake_host(NULL)), 0);
	struct cmos_rtc_state good, st;
	uint8_t b = 0x3f;
	cmos_rtc_io_write(c, 0, &b, 1);
	cmos_rtc_io_write(c, 1, &b, 1);
	cmos_rtc_save(c, &good);
	assert_int_equal(cmos_rtc_restore(c, &good, err, sizeof(err)), 0);

	/* Targeted: every index past the RAM is refused with a line naming the field. */
	for (unsigned idx = CMOS_SIZE; idx < 256; idx++) {
		st = good;
		st.index = (uint8_t)idx;
		assert_int_equal(cmos_rtc_restore(c, &st, err, sizeof(err)), -EINVAL);
		assert_non_null(strstr(err, "CMOS RTC: index"));
		poke_ports(cmos_rtc_io_read, cmos_rtc_io_write, c, 2, &seed);
	}
	st = good;
	st.version = 2;
	assert_int_equal(cmos_rtc_restore(c, &st, err, sizeof(err)), -EINVAL);

	for (int i = 0; i < ITERATIONS; i++) {
		st = good;
		mutate((uint8_t *)&st, sizeof(st), &seed);
		if (cmos_rtc_restore(c, &st, err, sizeof(err)) == 0)
			assert_true(c->index < CMOS_SIZE);
		poke_ports(cmos_rtc_io_read, cmos_rtc_io_write, c, 2, &seed);
	}
	cmos_rtc_destroy(c);
	free(c);
}

static void test_i8042_restore(void **state)
{
	(void)state;
	uint64_t seed = 0x8042;
	char err[256];
	struct i8042 *k = malloc(sizeof(*k));
	assert_non_null(k);
	assert_int_equal(i8042_create(k, fake_host(NULL)), 0);
	assert_int_equal(i8042_send_ctrl_alt_del(k), 0);
	struct i8042_state good, st;
	i8042_save(k, &good);
	assert_int_equal(i8042_restore(k, &good, err, sizeof(err)), 0);

	static const struct {
		size_t off;
		uint32_t v;
		const char *field;
	} bad[] = {
	    {offsetof(struct i8042_state, head), I8042_BUF, "head"},
	    {offsetof(struct i8042_state, head), 0xffffffff, "head"},
	    {offsetof(struct i8042_state, len), I8042_BUF + 1, "count"},
	    {offsetof(struct i8042_state, len), 0x80000000, "count"},
	    {offsetof(struct i8042_state, pending_cmd), 0xaa, "pending command"},
	    {offsetof(struct i8042_state, version), 0, "version"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		st = good;
		if (bad[i].off == offsetof(struct i8042_state, pending_cmd))
			st.pending_cmd = (uint8_t)bad[i].v;
		else
			memcpy((uint8_t *)&st + bad[i].off, &bad[i].v, 4);
		assert_int_equal(i8042_restore(k, &st, err, sizeof(err)), -EINVAL);
		assert_non_null(strstr(err, "i8042: "));
		assert_non_null(strstr(err, bad[i].field));
	}
	for (int i = 0; i < ITERATIONS; i++) {
		st = good;
		mutate((uint8_t *)&st, sizeof(st), &seed);
		if (i8042_restore(k, &st, err, sizeof(err)) == 0)
			assert_true(k->head < I8042_BUF && k->len <= I8042_BUF);
		poke_ports(i8042_io_read, i8042_io_write, k, 5, &seed);
		k->reset_requested = 0;
	}
	i8042_destroy(k);
	free(k);
}

static void test_serial_restore(void **state)
{
	(void)state;
	uint64_t seed = 0x3f8;
	char err[256];
	struct serial *s = malloc(sizeof(*s));
	assert_non_null(s);
	assert_int_equal(serial_create(s, fake_host(NULL), -1), 0);
	uint8_t b = 0x03;
	serial_io_write(s, 1, &b, 1); /* IER */
	assert_int_equal(serial_push_input(s, (const uint8_t *)"hi", 2), 2);
	struct serial_state good, st;
	serial_save(s, &good);
	assert_int_equal(serial_restore(s, &good, err, sizeof(err)), 0);

	st = good;
	st.r.ier = 0xf0;
	assert_int_equal(serial_restore(s, &st, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "serial: IER"));
	st = good;
	st.r.mcr = 0xe0;
	assert_int_equal(serial_restore(s, &st, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "serial: MCR"));
	st = good;
	st.r.iir_thre_pending = 2;
	assert_int_equal(serial_restore(s, &st, err, sizeof(err)), -EINVAL);
	st = good;
	st.irq_level = -1;
	assert_int_equal(serial_restore(s, &st, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "serial: IRQ level"));

	for (int i = 0; i < ITERATIONS; i++) {
		st = good;
		mutate((uint8_t *)&st, sizeof(st), &seed);
		if (serial_restore(s, &st, err, sizeof(err)) == 0)
			assert_true(!(s->r.ier & ~0x0f) && s->irq_level >= 0 && s->irq_level <= 1);
		/* Loopback writes feed the receive FIFO: its bounds are exercised too. */
		poke_ports(serial_io_read, serial_io_write, s, 8, &seed);
	}
	serial_destroy(s);
	free(s);
}

/* ---- virtio devices: transport + queue state, then MMIO access and kicks ---- */

struct vfix {
	struct guest_mem mem;
	struct virtio_mmio *t;
	struct virtio_blk *blk;
	struct virtio_vsock *vsock;
	char dir[64], path[108];
};

static void mwr(struct virtio_mmio *t, uint64_t off, uint32_t v)
{
	virtio_mmio_write(t, off, (const uint8_t *)&v, 4);
}

/* Drives the device through a normal driver start-up so the saved state is a real one. */
static void driver_start(struct virtio_mmio *t)
{
	mwr(t, 0x070, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER);
	mwr(t, 0x024, 1);
	mwr(t, 0x020, 1); /* VERSION_1 */
	mwr(t, 0x024, 0);
	mwr(t, 0x020, (uint32_t)VIRTIO_F_RING_EVENT_IDX);
	mwr(t, 0x070, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_FEATURES_OK);
	for (uint32_t q = 0; q < t->ops->nr_queues; q++) {
		mwr(t, 0x030, q);
		mwr(t, 0x038, 16);
		mwr(t, 0x080, (uint32_t)(0x1000 + q * 0x3000));
		mwr(t, 0x090, (uint32_t)(0x2000 + q * 0x3000));
		mwr(t, 0x0a0, (uint32_t)(0x3000 + q * 0x3000));
		mwr(t, 0x044, 1);
	}
	mwr(t, 0x070,
	    VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_FEATURES_OK |
		VIRTIO_STATUS_DRIVER_OK);
	assert_true(t->status & VIRTIO_STATUS_DRIVER_OK);
}

static void vfix_settle(struct vfix *f)
{
	if (f->blk) {
		virtio_blk_quiesce(f->blk);
		virtio_blk_poll(f->blk);
	}
	if (f->vsock)
		virtio_vsock_service(f->vsock);
}

/*
 * Makes each ready queue offer 1..size chains of plausible descriptors (addresses inside the
 * ring area, small lengths, random flags and links), so kicks reach the device's request code.
 */
static void offer_chains(struct vfix *f, uint64_t *seed)
{
	for (uint32_t q = 0; q < f->t->ops->nr_queues; q++) {
		const struct virtq *vq = &f->t->queues[q];
		if (!vq->ready)
			continue;
		uint8_t *desc = guest_mem_ptr(&f->mem, vq->desc_gpa, 16ULL * vq->size);
		uint8_t *avail = guest_mem_ptr(&f->mem, vq->avail_gpa, 6 + 2ULL * vq->size);
		/* Pairs: a readable header or packet, then a writable buffer; one in 8 is junk. */
		for (uint32_t i = 0; i + 1 < vq->size; i += 2) {
			for (uint32_t k = 0; k < 2; k++) {
				uint64_t addr =
				    0x20000 + rnd(seed) % (RING_AREA - 0x20000 - 0x1000);
				uint32_t len = k ? 1 + (uint32_t)(rnd(seed) % 2048)
						 : 16 + 44 * (rnd(seed) % 2);
				uint16_t flags = k ? VIRTQ_DESC_F_WRITE : VIRTQ_DESC_F_NEXT;
				uint16_t next = (uint16_t)(i + 1);
				if (rnd(seed) % 8 == 0)
					flags = (uint16_t)(rnd(seed) % 8),
					next = (uint16_t)rnd(seed);
				write_desc(desc + 16 * (i + k), addr, len, flags, next);
				if (!k) {
					uint32_t hdr[4] = {(uint32_t)(rnd(seed) % 16), 0,
							   (uint32_t)(rnd(seed) % 4096), 0};
					memcpy(guest_mem_ptr(&f->mem, addr, 16), hdr, 16);
				}
			}
		}
		for (uint32_t i = 0; i < vq->size; i++) {
			uint16_t head =
			    (uint16_t)(2 * (rnd(seed) % (vq->size / 2 ? vq->size / 2 : 1)));
			memcpy(avail + 4 + 2 * ((vq->last_avail + i) % vq->size), &head, 2);
		}
		uint16_t idx = (uint16_t)(vq->last_avail + 1 + rnd(seed) % vq->size);
		memcpy(avail + 2, &idx, 2);
	}
}

/* What a guest can do to a restored device: read every register, kick, write, kick again. */
static void exercise(struct vfix *f, uint64_t *seed)
{
	struct virtio_mmio *t = f->t;
	uint8_t b[8];
	for (uint64_t off = 0; off < 0x100; off += 4)
		virtio_mmio_read(t, off, b, 4);
	for (uint64_t off = 0x100; off < 0x140; off += 4)
		virtio_mmio_read(t, off, b, 4);
	offer_chains(f, seed);
	for (uint32_t q = 0; q < VIRTIO_MMIO_MAX_QUEUES; q++)
		mwr(t, 0x050, q);
	vfix_settle(f);
	/* Scribble on the rings and buffers the restored queues point at, then kick again. */
	uint8_t *ring = guest_mem_ptr(&f->mem, 0, RING_AREA);
	for (int i = 0; i < 16; i++)
		ring[rnd(seed) % RING_AREA] = (uint8_t)rnd(seed);
	for (uint32_t q = 0; q < VIRTIO_MMIO_MAX_QUEUES; q++)
		mwr(t, 0x050, q);
	vfix_settle(f);
	for (int i = 0; i < 8; i++) {
		uint64_t off = (rnd(seed) % 0x40) * 4;
		if (off == 0x070)
			continue; /* status: a reset would hide the restored state */
		mwr(t, off, (uint32_t)rnd(seed));
	}
	for (uint32_t q = 0; q < VIRTIO_MMIO_MAX_QUEUES; q++)
		mwr(t, 0x050, q);
	vfix_settle(f);
	mwr(t, 0x070, 0); /* reset before the next restore */
	vfix_settle(f);
}

struct vcase {
	size_t off, width;
	uint64_t v;
	const char *what;
};

#define QF(n, field) (offsetof(struct virtio_mmio_state, q[n].field))
#define SF(field)    (offsetof(struct virtio_mmio_state, field))

/* Out-of-range values for each field, and the words the refusal must contain. */
static const struct vcase vcases[] = {
    {SF(version), 4, 7, "version"},
    {SF(device_id), 4, 99, "not this device"},
    {SF(nr_queues), 4, 9, "not this device"},
    {SF(status), 4, 0x100, "status"},
    {SF(status), 4, VIRTIO_STATUS_DRIVER_OK | VIRTIO_STATUS_ACKNOWLEDGE, "DRIVER_OK without"},
    {SF(interrupt_status), 4, 4, "interrupt_status"},
    {SF(driver_features), 8, 1ULL << 40, "never offered"},
    {SF(driver_features), 8, 0, "VERSION_1"},
    {QF(0, size), 2, 0, "size"},
    {QF(0, size), 2, 3, "size"},
    {QF(0, size), 2, 512, "size"},
    {QF(0, size), 2, 0x8000, "size"},
    {QF(0, desc_gpa), 8, 0x1008, "rings"},
    {QF(0, avail_gpa), 8, 0x2001, "rings"},
    {QF(0, used_gpa), 8, 0x3002, "rings"},
    {QF(0, desc_gpa), 8, MEM_SIZE - 16, "rings"},
    {QF(0, used_gpa), 8, 0xfffffffffffff000ULL, "rings"},
    {QF(0, avail_gpa), 8, MMIO_HOLE_START, "rings"},
    {QF(0, ready), 1, 2, "flag"},
    {QF(0, last_avail), 2, 17, "in flight"},
    {QF(0, used_idx), 2, 1, "in flight"},
    {QF(7, size), 2, 16, "does not exist"},
    {QF(7, ready), 1, 1, "does not exist"},
};

static void run_virtio(struct vfix *f, uint64_t seed)
{
	char err[256];
	struct virtio_mmio *t = f->t;
	uint8_t *ring = guest_mem_ptr(&f->mem, 0, RING_AREA);
	for (uint64_t i = 0; i < RING_AREA; i++)
		ring[i] = (uint8_t)rnd(&seed);
	driver_start(t);
	struct virtio_mmio_state good, st;
	if (f->vsock)
		virtio_vsock_save(f->vsock, &good);
	else
		virtio_mmio_save(t, &good);
	mwr(t, 0x070, 0);
	assert_int_equal(virtio_mmio_restore(t, &good, err, sizeof(err)), 0);
	assert_true(t->status & VIRTIO_STATUS_DRIVER_OK);
	mwr(t, 0x070, 0);

	for (size_t i = 0; i < sizeof(vcases) / sizeof(vcases[0]); i++) {
		const struct vcase *c = &vcases[i];
		st = good;
		memcpy((uint8_t *)&st + c->off, &c->v, c->width);
		int r = virtio_mmio_restore(t, &st, err, sizeof(err));
		if (r == 0)
			fail_msg("%s: case %zu (%s) was accepted", t->ops->name, i, c->what);
		assert_non_null(strstr(err, t->ops->name));
		if (!strstr(err, c->what))
			fail_msg("case %zu: '%s' does not say '%s'", i, err, c->what);
		exercise(f, &seed);
	}
	for (int i = 0; i < ITERATIONS; i++) {
		st = good;
		mutate((uint8_t *)&st, sizeof(st), &seed);
		if (virtio_mmio_restore(t, &st, err, sizeof(err)) == 0) {
			for (uint32_t q = 0; q < t->ops->nr_queues; q++)
				if (t->queues[q].ready)
					assert_int_equal(virtq_check_layout(&t->queues[q]), 0);
		} else {
			assert_true(strlen(err) > 0 && !strchr(err, '\n'));
		}
		exercise(f, &seed);
	}
}

static void test_blk_restore(void **state)
{
	(void)state;
	struct vfix f = {0};
	assert_int_equal(guest_mem_create(&f.mem, MEM_SIZE), 0);
	char img[] = "/tmp/cove-restore-blk-XXXXXX";
	int fd = mkstemp(img);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, 1 << 20), 0);
	close(fd);
	f.blk = calloc(1, sizeof(*f.blk));
	assert_non_null(f.blk);
	int r = virtio_blk_create(f.blk, fake_host(&f.mem), img, false, NULL, NULL, 0,
				  VIRTIO_MMIO_BASE, 5, "fuzz");
	if (r == -ENOSYS || r == -EPERM) {
		unlink(img);
		skip(); /* io_uring disabled on this host */
	}
	assert_int_equal(r, 0);
	f.t = &f.blk->mmio;
	run_virtio(&f, 0xb1c);
	virtio_blk_destroy(f.blk);
	free(f.blk);
	unlink(img);
	guest_mem_destroy(&f.mem);
}

static void test_vsock_restore(void **state)
{
	(void)state;
	struct vfix f = {0};
	assert_int_equal(guest_mem_create(&f.mem, MEM_SIZE), 0);
	snprintf(f.dir, sizeof(f.dir), "/tmp/cove-restore-vsock-XXXXXX");
	assert_non_null(mkdtemp(f.dir));
	snprintf(f.path, sizeof(f.path), "%s/v.sock", f.dir);
	f.vsock = calloc(1, sizeof(*f.vsock));
	assert_non_null(f.vsock);
	assert_int_equal(
	    virtio_vsock_create(f.vsock, fake_host(&f.mem), 3, f.path, VIRTIO_MMIO_BASE, 5), 0);
	f.t = &f.vsock->mmio;
	run_virtio(&f, 0x50c);
	virtio_vsock_destroy(f.vsock);
	free(f.vsock);
	rmdir(f.dir);
	guest_mem_destroy(&f.mem);
}

/* board_restore: a bad section becomes one line naming the device and the field. */
static void test_board_restore_line(void **state)
{
	(void)state;
	struct board *b = calloc(1, sizeof(*b));
	assert_non_null(b);
	const struct vm_host *h = fake_host(NULL);
	assert_int_equal(serial_create(&b->com1, h, -1), 0);
	assert_int_equal(i8042_create(&b->kbd, h), 0);
	assert_int_equal(cmos_rtc_create(&b->rtc, h), 0);
	/* The board's sections as a snapshot writes them (serial 0, i8042 1, CMOS RTC 2)... */
	struct state_buf buf;
	state_buf_init(&buf);
	board_save(b, &buf);
	assert_int_equal(state_finish(&buf), 0);
	struct state_section_ref *secs;
	size_t n;
	char err[256];
	assert_int_equal(state_parse(buf.p, buf.len, &secs, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 3);
	/* ...with the RTC's register index pointed past its RAM. */
	struct state_section_ref *rtc = &secs[2];
	assert_ptr_equal(state_find(secs, n, SEC_DEVICE, 2), rtc);
	struct cmos_rtc_state rs;
	assert_int_equal(rtc->len, sizeof(rs));
	memcpy(&rs, rtc->payload, sizeof(rs));
	rtc->payload = (const uint8_t *)&rs;
	rs.index = 0xc8;
	assert_int_equal(board_restore(b, secs, n, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "state file: CMOS RTC: index 0xc8 is past the 128-byte RAM");
	rs.index = 0x10;
	assert_int_equal(board_restore(b, secs, n, err, sizeof(err)), 0);
	free(secs);
	state_buf_free(&buf);
	serial_destroy(&b->com1);
	i8042_destroy(&b->kbd);
	cmos_rtc_destroy(&b->rtc);
	free(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_cmos_restore),   cmocka_unit_test(test_i8042_restore),
	    cmocka_unit_test(test_serial_restore), cmocka_unit_test(test_blk_restore),
	    cmocka_unit_test(test_vsock_restore),  cmocka_unit_test(test_board_restore_line),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
