/*
 * Unit tests for devices/virtio_blk on a fake machine: request parsing (header types, sizes, sector
 * bounds, read-only, GET_ID, bad chains) and the notify budget and reset drain, over a real
 * io_uring on a temp image.
 */
#include <fcntl.h>
#include <stdbool.h>
#include <sys/timerfd.h>

#include "helpers.h"
#include "devices/virtio_blk.h"
#include "devices/virtio_mmio.h"
#include "devices/virtqueue.h"
#include "host_fake.h"
#include "vmm/guest_mem.h"

#define BQ	256
#define B_DESC	0x100000ULL
#define B_AVAIL 0x101000ULL
#define B_USED	0x102000ULL
#define B_HDRS	0x103000ULL
#define B_BUFS	0x110000ULL
#define B_DATA	0x200000ULL

struct blkfix {
	struct guest_mem mem;
	struct host_fake hf;
	struct virtio_blk blk;
	char img[64];
	uint16_t avail; /* requests offered so far (the driver's avail->idx) */
};

static void bw(struct blkfix *f, uint64_t off, uint32_t v)
{
	virtio_fake_write(&f->blk.mmio, off, v);
}

static void *bp(struct blkfix *f, uint64_t gpa, uint64_t len)
{
	void *p = guest_mem_ptr(&f->mem, gpa, len);
	assert_non_null(p);
	return p;
}

static void bdesc(struct blkfix *f, int i, uint64_t addr, uint32_t len, uint16_t flags,
		  uint16_t next)
{
	write_desc(bp(f, B_DESC + 16ULL * i, 16), addr, len, flags, next);
}

/* A blk device over a 4 MiB temp image, queue 0 of BQ entries ready; skips without io_uring. */
static struct blkfix *blkfix_open(bool read_only)
{
	struct blkfix *f = calloc(1, sizeof(*f));
	assert_non_null(f);
	assert_int_equal(guest_mem_create(&f->mem, 8ULL << 20), 0);
	snprintf(f->img, sizeof(f->img), "/tmp/cove-blk-XXXXXX");
	tmp_file(f->img, 4 << 20);
	assert_int_equal(host_fake_init(&f->hf, &f->mem), 0);
	int r = virtio_blk_create(&f->blk, &f->hf.host, f->img, read_only, NULL, NULL, 0,
				  VIRTIO_MMIO_BASE, 5, "unit");
	if (r == -ENOSYS || r == -EPERM) {
		host_fake_destroy(&f->hf);
		unlink(f->img);
		guest_mem_destroy(&f->mem);
		free(f);
		skip(); /* io_uring is disabled on this host */
	}
	assert_int_equal(r, 0);
	virtio_fake_driver_ready(&f->blk.mmio, 1, BQ, B_DESC, B_AVAIL, B_USED, 0);
	assert_true(f->blk.mmio.status & VIRTIO_STATUS_DRIVER_OK);
	return f;
}

static struct blkfix *blkfix_new(void)
{
	return blkfix_open(false);
}

static void blkfix_free(struct blkfix *f)
{
	virtio_blk_destroy(&f->blk);
	host_fake_destroy(&f->hf);
	unlink(f->img);
	guest_mem_destroy(&f->mem);
	free(f);
}

/* 128 GET_ID chains (header + 21 writable bytes) on every avail slot. */
static void offer_get_id(struct blkfix *f)
{
	for (int c = 0; c < BQ / 2; c++) {
		uint32_t hdr[4] = {8, 0, 0, 0};
		memcpy(bp(f, B_HDRS + 16ULL * c, 16), hdr, 16);
		bdesc(f, 2 * c, B_HDRS + 16ULL * c, 16, VIRTQ_DESC_F_NEXT, (uint16_t)(2 * c + 1));
		bdesc(f, 2 * c + 1, B_BUFS + 32ULL * c, 21, VIRTQ_DESC_F_WRITE, 0);
	}
	uint16_t *ring = bp(f, B_AVAIL + 4, 2 * BQ);
	for (int i = 0; i < BQ; i++)
		ring[i] = (uint16_t)(2 * (i % (BQ / 2)));
}

/*
 * The flooding guest, made deterministic: every time the device publishes a used entry the
 * "guest" has already put the next request on the ring (avail->idx stays a whole ring ahead),
 * up to `refills` times.
 */
static struct blkfix *flood_fix;
static uint64_t refills;

static void refill_on_push(void *opaque, uint64_t gpa, uint64_t len)
{
	(void)opaque;
	(void)len;
	if (gpa != B_USED + 2 || !refills)
		return;
	refills--;
	uint16_t *avail_idx = bp(flood_fix, B_AVAIL + 2, 2),
		 *used_idx = bp(flood_fix, B_USED + 2, 2);
	*avail_idx = (uint16_t)(*used_idx + BQ);
}

/*
 * A guest that never lets the ring go empty: one notification must return after at most a
 * ring's worth of requests and defer the rest (re-kicked after the event loop's other fds), not
 * serve the ring for as long as the guest keeps it full.
 */
static void test_blk_notify_budget(void **state)
{
	(void)state;
	struct blkfix *f = blkfix_new();
	offer_get_id(f);
	*(volatile uint16_t *)bp(f, B_AVAIL + 2, 2) = BQ;
	flood_fix = f;
	refills = 100000;
	f->blk.mmio.queues[0].mark_dirty = refill_on_push;
	for (int kick = 0; kick < 20; kick++) {
		uint64_t before = f->blk.requests;
		bw(f, 0x050, 0); /* what the event loop does for one notify */
		uint64_t served = f->blk.requests - before;
		if (served > VIRTIO_NOTIFY_BUDGET)
			fail_msg("kick %d served %llu requests in one go (budget %d)", kick,
				 (unsigned long long)served, VIRTIO_NOTIFY_BUDGET);
		assert_int_equal(served, VIRTIO_NOTIFY_BUDGET);
		/* Work is left: the queue was deferred, not dropped. */
		assert_true(f->blk.mmio.deferred & 1u);
		f->blk.mmio.deferred = 0;
	}
	assert_int_equal(f->blk.mmio.status & VIRTIO_STATUS_NEEDS_RESET, 0);
	uint8_t *id = bp(f, B_BUFS, 21);
	assert_memory_equal(id, "unit", 4);
	assert_int_equal(id[20], 0); /* VIRTIO_BLK_S_OK */
	blkfix_free(f);
}

/* Pages the device reported written (what the VMM's dirty bitmap would hold). */
static uint8_t dirty_pages[(8 << 20) / 4096];

static void note_dirty(void *opaque, uint64_t gpa, uint64_t len)
{
	(void)opaque;
	for (uint64_t a = gpa & ~4095ULL; a < gpa + len && a < (8ULL << 20); a += 4096)
		dirty_pages[a / 4096] = 1;
}

/*
 * Reads in flight when the driver resets the device: the reset returns only once none is
 * left, every page they wrote is marked dirty, and nothing writes guest memory afterwards.
 */
static void test_blk_reset_drains_reads(void **state)
{
	(void)state;
	struct blkfix *f = blkfix_new();
	memset(dirty_pages, 0, sizeof(dirty_pages));
	f->hf.on_dirty = note_dirty;
	/* The image holds 0xab everywhere; the guest's buffers start zeroed. */
	int fd = open(f->img, O_WRONLY);
	assert_true(fd >= 0);
	static uint8_t pattern[1 << 20];
	memset(pattern, 0xab, sizeof(pattern));
	for (int i = 0; i < 4; i++)
		assert_int_equal(pwrite(fd, pattern, sizeof(pattern), (off_t)i << 20),
				 sizeof(pattern));
	close(fd);
	enum { NREQ = 32, LEN = 64 << 10 };
	for (int c = 0; c < NREQ; c++) {
		uint32_t hdr[4] = {0 /* IN */, 0, (uint32_t)(c * (LEN / 512)), 0};
		memcpy(bp(f, B_HDRS + 16ULL * c, 16), hdr, 16);
		bdesc(f, 3 * c, B_HDRS + 16ULL * c, 16, VIRTQ_DESC_F_NEXT, (uint16_t)(3 * c + 1));
		bdesc(f, 3 * c + 1, B_DATA + (uint64_t)c * LEN, LEN,
		      VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT, (uint16_t)(3 * c + 2));
		bdesc(f, 3 * c + 2, B_BUFS + 32ULL * c, 1, VIRTQ_DESC_F_WRITE, 0);
		((uint16_t *)bp(f, B_AVAIL + 4, 2 * BQ))[c] = (uint16_t)(3 * c);
	}
	memset(bp(f, B_DATA, (uint64_t)NREQ * LEN), 0, (uint64_t)NREQ * LEN);
	*(uint16_t *)bp(f, B_AVAIL + 2, 2) = NREQ;
	bw(f, 0x050, 0); /* submitted to io_uring; nobody reaps them (no event loop here) */
	assert_int_equal(f->blk.requests, NREQ);
	bw(f, 0x070, 0); /* the driver resets the device */
	assert_int_equal(f->blk.be.inflight, 0);
	/* Whatever landed before the reset finished is marked: here, all of it. */
	for (int c = 0; c < NREQ; c++) {
		uint8_t *data = bp(f, B_DATA + (uint64_t)c * LEN, LEN);
		for (uint64_t pg = 0; pg < LEN / 4096; pg++)
			if (data[pg * 4096] &&
			    !dirty_pages[(B_DATA + (uint64_t)c * LEN) / 4096 + pg])
				fail_msg("request %d page %llu was written and not marked dirty", c,
					 (unsigned long long)pg);
	}
	/* The driver forgot them: no used entries, and after the reset nothing touches RAM. */
	assert_int_equal(*(uint16_t *)bp(f, B_USED + 2, 2), 0);
	memset(bp(f, B_DATA, (uint64_t)NREQ * LEN), 0, (uint64_t)NREQ * LEN);
	usleep(20000);
	virtio_blk_poll(&f->blk);
	uint8_t *data = bp(f, B_DATA, (uint64_t)NREQ * LEN);
	for (uint64_t i = 0; i < (uint64_t)NREQ * LEN; i += 512)
		assert_int_equal(data[i], 0);
	blkfix_free(f);
}

/* ---- request parsing ---- */

/* The virtio spec's request types and status bytes (virtio 1.1, 5.2.6). */
enum { T_IN = 0, T_OUT = 1, T_FLUSH = 4, T_GET_ID = 8, T_DISCARD = 11, T_WRITE_ZEROES = 13 };
enum { S_OK = 0, S_IOERR = 1, S_UNSUPP = 2, S_NONE = 0xff };

#define IMG_SECTORS ((4u << 20) / 512)

/* Offers the chain at `head`, kicks, and reaps until the device put it on the used ring. */
static void run_chain(struct blkfix *f, uint16_t head)
{
	uint16_t *ring = bp(f, B_AVAIL + 4, 2 * BQ);
	ring[f->avail % BQ] = head;
	f->avail++;
	*(volatile uint16_t *)bp(f, B_AVAIL + 2, 2) = f->avail;
	bw(f, 0x050, 0);
	for (int i = 0; i < 5000; i++) {
		if (*(volatile uint16_t *)bp(f, B_USED + 2, 2) == f->avail)
			return;
		usleep(1000);
		virtio_blk_poll(&f->blk);
	}
	fail_msg("request %u not completed", f->avail);
}

/*
 * One request: header (type, sector) at B_HDRS, then `len` data bytes at B_DATA (readable for
 * a write, writable otherwise; none when len is 0), then the status byte. Returns the status.
 */
static int request(struct blkfix *f, uint32_t type, uint64_t sector, uint32_t len, bool data_in)
{
	uint32_t hdr[4] = {type, 0, (uint32_t)sector, (uint32_t)(sector >> 32)};
	memcpy(bp(f, B_HDRS, 16), hdr, 16);
	uint8_t *status = bp(f, B_BUFS, 1);
	*status = S_NONE;
	if (len) {
		bdesc(f, 0, B_HDRS, 16, VIRTQ_DESC_F_NEXT, 1);
		bdesc(f, 1, B_DATA, len,
		      (uint16_t)(VIRTQ_DESC_F_NEXT | (data_in ? VIRTQ_DESC_F_WRITE : 0)), 2);
		bdesc(f, 2, B_BUFS, 1, VIRTQ_DESC_F_WRITE, 0);
	} else {
		bdesc(f, 0, B_HDRS, 16, VIRTQ_DESC_F_NEXT, 2);
		bdesc(f, 2, B_BUFS, 1, VIRTQ_DESC_F_WRITE, 0);
	}
	run_chain(f, 0);
	return *status;
}

/* A DISCARD or WRITE_ZEROES request with one segment (sector, num, flags). */
static int ranged(struct blkfix *f, uint32_t type, uint64_t sector, uint32_t num, uint32_t flags)
{
	uint8_t *seg = bp(f, B_DATA, 16);
	memcpy(seg, &sector, 8);
	memcpy(seg + 8, &num, 4);
	memcpy(seg + 12, &flags, 4);
	return request(f, type, 0, 16, false);
}

/* The used length the device reported for the last request (data written + status byte). */
static uint32_t last_used_len(struct blkfix *f)
{
	uint32_t len;
	memcpy(&len, bp(f, B_USED + 4 + 8ULL * ((f->avail - 1) % BQ) + 4, 4), 4);
	return len;
}

static void test_blk_read_write(void **state)
{
	(void)state;
	struct blkfix *f = blkfix_new();
	uint8_t *data = bp(f, B_DATA, 4096);
	for (int i = 0; i < 1024; i++)
		data[i] = (uint8_t)(i * 7 + 1);
	assert_int_equal(request(f, T_OUT, 5, 1024, false), S_OK);
	assert_int_equal(last_used_len(f), 1);
	uint8_t file[1024];
	int fd = open(f->img, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, file, sizeof(file), 5 * 512), sizeof(file));
	close(fd);
	assert_memory_equal(file, data, sizeof(file));
	memset(data, 0, 4096);
	assert_int_equal(request(f, T_IN, 5, 1024, true), S_OK);
	assert_int_equal(last_used_len(f), 1025);
	assert_memory_equal(data, file, sizeof(file));
	assert_int_equal(request(f, T_FLUSH, 0, 0, false), S_OK);
	assert_int_equal(f->blk.errors, 0);
	blkfix_free(f);
}

/* Sizes not a whole number of sectors and ranges past the end fail; the end itself is fine. */
static void test_blk_sector_bounds(void **state)
{
	(void)state;
	struct blkfix *f = blkfix_new();
	assert_int_equal(f->blk.capacity, IMG_SECTORS);
	assert_int_equal(request(f, T_IN, IMG_SECTORS - 1, 512, true), S_OK);
	assert_int_equal(request(f, T_IN, IMG_SECTORS - 1, 1024, true), S_IOERR);
	assert_int_equal(request(f, T_IN, IMG_SECTORS, 512, true), S_IOERR);
	assert_int_equal(request(f, T_IN, IMG_SECTORS, 0, true), S_OK);
	assert_int_equal(request(f, T_IN, IMG_SECTORS + 1, 0, true), S_IOERR);
	assert_int_equal(request(f, T_IN, UINT64_MAX, 512, true), S_IOERR);
	assert_int_equal(request(f, T_IN, 1ULL << 55, 512, true), S_IOERR);
	assert_int_equal(request(f, T_IN, 0, 100, true), S_IOERR);
	assert_int_equal(request(f, T_OUT, 0, 513, false), S_IOERR);
	assert_int_equal(request(f, T_OUT, IMG_SECTORS - 1, 1024, false), S_IOERR);
	assert_int_equal(request(f, T_OUT, UINT64_MAX, 512, false), S_IOERR);
	assert_int_equal(request(f, T_OUT, IMG_SECTORS - 2, 1024, false), S_OK);
	assert_int_equal(f->blk.errors, 9);
	assert_int_equal(f->blk.mmio.status & VIRTIO_STATUS_NEEDS_RESET, 0);
	blkfix_free(f);
}

/* Unknown types are UNSUPP; discard and write-zeroes check their segment. */
static void test_blk_types(void **state)
{
	(void)state;
	struct blkfix *f = blkfix_new();
	assert_int_equal(request(f, 2, 0, 0, false), S_UNSUPP);
	assert_int_equal(request(f, 99, 0, 512, true), S_UNSUPP);
	assert_int_equal(request(f, UINT32_MAX, 0, 0, false), S_UNSUPP);
	/* write zeroes: really zeroes, flags other than UNMAP and oversized counts unsupported */
	uint8_t *data = bp(f, B_DATA, 1024);
	memset(data, 0x5a, 1024);
	assert_int_equal(request(f, T_OUT, 10, 1024, false), S_OK);
	assert_int_equal(ranged(f, T_WRITE_ZEROES, 10, 2, 0), S_OK);
	memset(data, 0x5a, 1024);
	assert_int_equal(request(f, T_IN, 10, 1024, true), S_OK);
	for (int i = 0; i < 1024; i++)
		assert_int_equal(data[i], 0);
	assert_int_equal(ranged(f, T_WRITE_ZEROES, 0, 1, 2), S_UNSUPP);
	assert_int_equal(ranged(f, T_WRITE_ZEROES, 0, (1u << 22) + 1, 0), S_UNSUPP);
	assert_int_equal(ranged(f, T_WRITE_ZEROES, IMG_SECTORS - 1, 2, 0), S_IOERR);
	assert_int_equal(ranged(f, T_WRITE_ZEROES, 0, 0, 0), S_OK);
	/* discard: no flags at all */
	assert_int_equal(ranged(f, T_DISCARD, 0, 8, 0), S_OK);
	assert_int_equal(ranged(f, T_DISCARD, 0, 8, 1), S_UNSUPP);
	assert_int_equal(ranged(f, T_DISCARD, UINT64_MAX, 1, 0), S_IOERR);
	/* the segment must be exactly 16 bytes */
	assert_int_equal(request(f, T_DISCARD, 0, 8, false), S_IOERR);
	assert_int_equal(request(f, T_WRITE_ZEROES, 0, 32, false), S_IOERR);
	blkfix_free(f);
}

static void test_blk_read_only(void **state)
{
	(void)state;
	struct blkfix *f = blkfix_open(true);
	uint8_t *data = bp(f, B_DATA, 512);
	memset(data, 0x77, 512);
	assert_int_equal(request(f, T_OUT, 0, 512, false), S_IOERR);
	assert_int_equal(ranged(f, T_WRITE_ZEROES, 0, 1, 0), S_IOERR);
	assert_int_equal(ranged(f, T_DISCARD, 0, 1, 0), S_IOERR);
	assert_int_equal(request(f, T_FLUSH, 0, 0, false), S_OK);
	assert_int_equal(request(f, T_IN, 0, 512, true), S_OK);
	for (int i = 0; i < 512; i++)
		assert_int_equal(data[i], 0); /* the write did not reach the image */
	blkfix_free(f);
}

/* GET_ID fills at most 20 bytes of the writable space, NUL-padded, and reports that length. */
static void test_blk_get_id(void **state)
{
	(void)state;
	struct blkfix *f = blkfix_new();
	uint8_t *id = bp(f, B_DATA, 64);
	memset(id, 0xee, 64);
	assert_int_equal(request(f, T_GET_ID, 0, 40, true), S_OK);
	assert_memory_equal(id, "unit", 4);
	for (int i = 4; i < VIRTIO_BLK_ID_BYTES; i++)
		assert_int_equal(id[i], 0);
	assert_int_equal(id[VIRTIO_BLK_ID_BYTES], 0xee);
	assert_int_equal(last_used_len(f), VIRTIO_BLK_ID_BYTES + 1);
	memset(id, 0xee, 64);
	assert_int_equal(request(f, T_GET_ID, 0, 3, true), S_OK);
	assert_memory_equal(id, "uni", 3);
	assert_int_equal(id[3], 0xee);
	assert_int_equal(last_used_len(f), 4);
	assert_int_equal(request(f, T_GET_ID, 0, 0, false), S_OK);
	assert_int_equal(last_used_len(f), 1);
	blkfix_free(f);
}

/*
 * A header shorter than 16 bytes or no writable status byte fails the request; a chain the
 * virtqueue refuses (a loop) puts the device in NEEDS_RESET instead of serving it.
 */
static void test_blk_bad_chains(void **state)
{
	(void)state;
	struct blkfix *f = blkfix_new();
	uint8_t *status = bp(f, B_BUFS, 1);
	/* 8-byte header split off: out_len < 16 */
	*status = S_NONE;
	bdesc(f, 0, B_HDRS, 8, VIRTQ_DESC_F_NEXT, 2);
	bdesc(f, 2, B_BUFS, 1, VIRTQ_DESC_F_WRITE, 0);
	run_chain(f, 0);
	assert_int_equal(*status, S_IOERR);
	/* a header split over two descriptors is fine */
	uint32_t hdr[4] = {T_GET_ID, 0, 0, 0};
	memcpy(bp(f, B_HDRS, 16), hdr, 16);
	*status = S_NONE;
	bdesc(f, 0, B_HDRS, 8, VIRTQ_DESC_F_NEXT, 1);
	bdesc(f, 1, B_HDRS + 8, 8, VIRTQ_DESC_F_NEXT, 2);
	bdesc(f, 2, B_BUFS, 1, VIRTQ_DESC_F_WRITE, 0);
	run_chain(f, 0);
	assert_int_equal(*status, S_OK);
	/* Nothing writable, so no status byte: the request fails and the chain goes back. */
	*status = S_NONE;
	bdesc(f, 0, B_HDRS, 16, VIRTQ_DESC_F_NEXT, 2);
	bdesc(f, 2, B_BUFS, 1, 0, 0);
	run_chain(f, 0);
	assert_int_equal(last_used_len(f), 0);
	assert_int_equal(*status, S_NONE);
	assert_int_equal(f->blk.errors, 2);
	assert_int_equal(f->blk.mmio.status & VIRTIO_STATUS_NEEDS_RESET, 0);
	/* a loop: the device stops and asks for a reset */
	bdesc(f, 0, B_HDRS, 16, VIRTQ_DESC_F_NEXT, 1);
	bdesc(f, 1, B_DATA, 512, VIRTQ_DESC_F_NEXT | VIRTQ_DESC_F_WRITE, 0);
	uint16_t *ring = bp(f, B_AVAIL + 4, 2 * BQ);
	ring[f->avail % BQ] = 0;
	*(volatile uint16_t *)bp(f, B_AVAIL + 2, 2) = (uint16_t)(f->avail + 1);
	bw(f, 0x050, 0);
	assert_true(f->blk.mmio.status & VIRTIO_STATUS_NEEDS_RESET);
	blkfix_free(f);
}

/*
 * The device never writes into a descriptor the driver marked device-readable: a chain with no
 * writable segment (a write whose "status" byte is readable, or a header alone) fails with
 * nothing written, to guest memory or the image, and 0 bytes used; the device keeps serving.
 */
static void test_blk_status_not_writable(void **state)
{
	(void)state;
	struct blkfix *f = blkfix_new();
	uint8_t *status = bp(f, B_BUFS, 1);
	uint8_t *data = bp(f, B_DATA, 512);
	/* header, data to write, then a readable last byte */
	uint32_t hdr[4] = {T_OUT, 0, 0, 0};
	memcpy(bp(f, B_HDRS, 16), hdr, 16);
	memset(data, 0x5a, 512);
	*status = S_NONE;
	bdesc(f, 0, B_HDRS, 16, VIRTQ_DESC_F_NEXT, 1);
	bdesc(f, 1, B_DATA, 512, VIRTQ_DESC_F_NEXT, 2);
	bdesc(f, 2, B_BUFS, 1, 0, 0);
	run_chain(f, 0);
	assert_int_equal(*status, S_NONE);
	assert_int_equal(last_used_len(f), 0);
	/* a header alone: its last byte is the header's, which must stay as the driver wrote it */
	hdr[0] = T_GET_ID;
	memcpy(bp(f, B_HDRS, 16), hdr, 16);
	bdesc(f, 0, B_HDRS, 16, 0, 0);
	run_chain(f, 0);
	assert_int_equal(((uint8_t *)bp(f, B_HDRS, 16))[15], 0);
	assert_int_equal(last_used_len(f), 0);
	assert_int_equal(f->blk.errors, 2);
	assert_int_equal(f->blk.mmio.status & VIRTIO_STATUS_NEEDS_RESET, 0);
	/* the write never reached the image, and a well-formed request after them is served */
	assert_int_equal(request(f, T_IN, 0, 512, true), S_OK);
	for (int i = 0; i < 512; i++)
		assert_int_equal(data[i], 0);
	blkfix_free(f);
}

/* ---- rate limit ---- */

/* The limiter's clock in these tests: a number the test moves. */
static uint64_t fake_clock(void *ctx)
{
	return *(uint64_t *)ctx;
}

/* Waits (I/O, not the limiter) until the used index reaches `want`; returns what it reached. */
static uint16_t reap_until(struct blkfix *f, uint16_t want)
{
	for (int i = 0; i < 5000; i++) {
		uint16_t u = *(volatile uint16_t *)bp(f, B_USED + 2, 2);
		if (u == want)
			return u;
		usleep(1000);
		virtio_blk_poll(&f->blk);
	}
	return *(volatile uint16_t *)bp(f, B_USED + 2, 2);
}

/*
 * A queue of 4 KiB reads (odd ones) and writes (even ones) under 8 KiB/s: only what the
 * bucket allows completes; the rest stays in the avail ring (not failed, not dropped) until
 * the clock moves and the timer fires, then completes; every request ends OK with its data.
 */
static void test_blk_rate_limit_bytes(void **state)
{
	(void)state;
	struct blkfix *f = blkfix_new();
	uint64_t now = 0;
	f->blk.clock_ns = fake_clock;
	f->blk.clock_ctx = &now;
	struct rate_limit lim = {.bw = 8192};
	assert_int_equal(virtio_blk_set_rate(&f->blk, &lim), 0);
	enum { NREQ = 9, LEN = 4096 };
	uint8_t *data = bp(f, B_DATA, (uint64_t)NREQ * LEN);
	for (int c = 0; c < NREQ; c++) {
		bool rd = c % 2;
		uint32_t hdr[4] = {rd ? T_IN : T_OUT, 0, (uint32_t)(c * (LEN / 512)), 0};
		memcpy(bp(f, B_HDRS + 16ULL * c, 16), hdr, 16);
		memset(data + (uint64_t)c * LEN, rd ? 0 : 0x10 + c, LEN);
		bdesc(f, 3 * c, B_HDRS + 16ULL * c, 16, VIRTQ_DESC_F_NEXT, (uint16_t)(3 * c + 1));
		bdesc(f, 3 * c + 1, B_DATA + (uint64_t)c * LEN, LEN,
		      (uint16_t)(VIRTQ_DESC_F_NEXT | (rd ? VIRTQ_DESC_F_WRITE : 0)),
		      (uint16_t)(3 * c + 2));
		bdesc(f, 3 * c + 2, B_BUFS + c, 1, VIRTQ_DESC_F_WRITE, 0);
		*(uint8_t *)bp(f, B_BUFS + c, 1) = S_NONE;
		((uint16_t *)bp(f, B_AVAIL + 4, 2 * BQ))[c] = (uint16_t)(3 * c);
	}
	*(uint16_t *)bp(f, B_AVAIL + 2, 2) = NREQ;
	bw(f, 0x050, 0);
	/* The full bucket: two requests. The third is back in the avail ring, a timer armed. */
	assert_int_equal(f->blk.mmio.queues[0].last_avail, 2);
	assert_true(f->blk.throttled);
	assert_int_equal(f->blk.throttle_waits, 1);
	struct itimerspec its;
	assert_int_equal(timerfd_gettime(f->blk.rate_tfd, &its), 0);
	assert_true(its.it_value.tv_sec == 0 && its.it_value.tv_nsec > 0 &&
		    its.it_value.tv_nsec <= 500000000); /* 4096 bytes at 8192/s */
	assert_int_equal(reap_until(f, 2), 2);
	/* Kicks while throttled take nothing; nor does the timer while the clock stands. */
	bw(f, 0x050, 0);
	virtio_blk_rate_timer(&f->blk);
	assert_int_equal(f->blk.mmio.queues[0].last_avail, 2);
	/* A snapshot now (quiesce, save) records exactly the two as consumed. */
	virtio_blk_quiesce(&f->blk);
	struct virtio_mmio_state st;
	virtio_mmio_save(&f->blk.mmio, &st);
	assert_int_equal(st.q[0].last_avail, 2);
	assert_int_equal(st.q[0].used_idx, 2);
	/* Half a second: one more. */
	now += 500000000ULL;
	virtio_blk_rate_timer(&f->blk);
	assert_int_equal(f->blk.mmio.queues[0].last_avail, 3);
	assert_int_equal(reap_until(f, 3), 3);
	/* Each second after: two more, until all are done. */
	int seconds = 0;
	while (f->blk.mmio.queues[0].last_avail < NREQ) {
		uint16_t before = f->blk.mmio.queues[0].last_avail;
		now += 1000000000ULL;
		virtio_blk_rate_timer(&f->blk);
		assert_int_equal(f->blk.mmio.queues[0].last_avail - before,
				 before + 2 <= NREQ ? 2 : NREQ - before);
		seconds++;
	}
	assert_int_equal(seconds, 3);
	assert_int_equal(reap_until(f, NREQ), NREQ);
	assert_false(f->blk.throttled);
	for (int c = 0; c < NREQ; c++)
		assert_int_equal(*(uint8_t *)bp(f, B_BUFS + c, 1), S_OK);
	/* Reads saw the image, writes reached it. */
	int fd = open(f->img, O_RDONLY);
	assert_true(fd >= 0);
	uint8_t buf[LEN];
	for (int c = 0; c < NREQ; c += 2) {
		assert_int_equal(pread(fd, buf, LEN, (off_t)c * LEN), LEN);
		for (int i = 0; i < LEN; i++)
			assert_int_equal(buf[i], 0x10 + c);
	}
	close(fd);
	assert_int_equal(f->blk.errors, 0);
	blkfix_free(f);
}

/*
 * An ops limit with a one-time burst: GET_ID requests (no data) go 3 + 1 at once, then one per
 * 500 ms; lifting the limit at run time serves the rest at once.
 */
static void test_blk_rate_limit_ops(void **state)
{
	(void)state;
	struct blkfix *f = blkfix_new();
	uint64_t now = 0;
	f->blk.clock_ns = fake_clock;
	f->blk.clock_ctx = &now;
	struct rate_limit lim = {.iops = 2, .iops_burst = 2};
	assert_int_equal(virtio_blk_set_rate(&f->blk, &lim), 0);
	offer_get_id(f);
	*(uint16_t *)bp(f, B_AVAIL + 2, 2) = 20;
	bw(f, 0x050, 0);
	assert_int_equal(f->blk.requests, 4);
	assert_int_equal(*(uint16_t *)bp(f, B_USED + 2, 2), 4);
	now += 499999999ULL;
	virtio_blk_rate_timer(&f->blk);
	assert_int_equal(f->blk.requests, 4);
	now += 1;
	virtio_blk_rate_timer(&f->blk);
	assert_int_equal(f->blk.requests, 5);
	struct rate_limit none = {0};
	assert_int_equal(virtio_blk_set_rate(&f->blk, &none), 0);
	assert_int_equal(f->blk.requests, 20);
	assert_int_equal(*(uint16_t *)bp(f, B_USED + 2, 2), 20);
	/* Out of range is refused and changes nothing. */
	struct rate_limit huge = {.bw = TB_MAX_TOKENS + 1};
	assert_int_equal(virtio_blk_set_rate(&f->blk, &huge), -EINVAL);
	assert_true(rate_limiter_unlimited(&f->blk.rl));
	blkfix_free(f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_blk_read_write),
	    cmocka_unit_test(test_blk_sector_bounds),
	    cmocka_unit_test(test_blk_types),
	    cmocka_unit_test(test_blk_read_only),
	    cmocka_unit_test(test_blk_get_id),
	    cmocka_unit_test(test_blk_bad_chains),
	    cmocka_unit_test(test_blk_notify_budget),
	    cmocka_unit_test(test_blk_reset_drains_reads),
	    cmocka_unit_test(test_blk_status_not_writable),
	    cmocka_unit_test(test_blk_rate_limit_bytes),
	    cmocka_unit_test(test_blk_rate_limit_ops),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
