/*
 * libFuzzer target: mutated state files fed into every device's restore path (snapshot/
 * board_state.c: serial, i8042, CMOS RTC, and virtio-mmio transport + own state of virtio-blk,
 * virtio-vsock and virtio-rng), then the restored board driven like a guest: resume, kicks on
 * every queue, register reads, port I/O. The input is a u16 length, a state file of that length
 * (the harness writes its CRCs) and the guest RAM the restored rings point into.
 *
 * COVE_FUZZ_WRITE_SEED=FILE makes the target write a real state file of its board (the driver
 * started on every device) as a seed input and exit: tools/fuzz-seeds uses it.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/byteorder.h"
#include "common/crc32.h"
#include "devices/board.h"
#include "devices/virtio_blk.h"
#include "devices/virtio_vsock.h"
#include "fuzz.h"
#include "host_fake.h"
#include "snapshot/board_state.h"
#include "snapshot/state_file.h"
#include "vmm/guest_mem.h"

#define MEM	  (4ULL << 20)
#define RING_AREA 0x40000ULL /* guest RAM from the input; restored rings point anywhere in RAM */

struct rs_world {
	struct guest_mem mem;
	struct host_fake hf;
	struct board board;
	char dir[64];
};

static void check_ram(void *opaque, uint64_t gpa, uint64_t len)
{
	const struct guest_mem *mem = opaque;
	if (len && !guest_mem_ptr(mem, gpa, len))
		abort();
}

static void mwr(struct virtio_mmio *t, uint64_t off, uint32_t v)
{
	virtio_mmio_write(t, off, (const uint8_t *)&v, 4);
}

static void settle(struct rs_world *w)
{
	for (int i = 0; i < w->board.nr_virtio; i++) {
		const struct board_dev *d = &w->board.devs[i];
		if (d->type == &virtio_blk_type) {
			virtio_blk_quiesce(d->dev);
			virtio_blk_poll(d->dev);
		} else if (d->type == &virtio_vsock_type) {
			virtio_vsock_service(d->dev);
		}
	}
}

static void reset_all(struct rs_world *w)
{
	for (int i = 0; i < w->board.nr_virtio; i++)
		mwr(w->board.virtio[i], 0x070, 0);
	settle(w);
}

/* A driver start-up on device `i`: queue q's rings at 0x1000 + i * 0xa000 + q * 0x3000. */
static void driver_start(struct virtio_mmio *t, int i)
{
	const uint32_t s = VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER;
	mwr(t, 0x070, s);
	mwr(t, 0x024, 1);
	mwr(t, 0x020, 1); /* VERSION_1 */
	mwr(t, 0x024, 0);
	mwr(t, 0x020, (uint32_t)VIRTIO_F_RING_EVENT_IDX);
	mwr(t, 0x070, s | VIRTIO_STATUS_FEATURES_OK);
	for (uint32_t q = 0; q < t->ops->nr_queues; q++) {
		uint32_t base = 0x1000 + (uint32_t)i * 0xa000 + q * 0x3000;
		mwr(t, 0x030, q);
		mwr(t, 0x038, 16);
		mwr(t, 0x080, base);
		mwr(t, 0x090, base + 0x1000);
		mwr(t, 0x0a0, base + 0x2000);
		mwr(t, 0x044, 1);
	}
	mwr(t, 0x070, s | VIRTIO_STATUS_FEATURES_OK | VIRTIO_STATUS_DRIVER_OK);
}

static int make_file(const char *path, off_t size)
{
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	int r = ftruncate(fd, size);
	close(fd);
	return r;
}

/* Writes a state file of the started board (u16 length first, as inputs are) and exits. */
static void write_seed(struct rs_world *w, const char *out)
{
	for (int i = 0; i < w->board.nr_virtio; i++)
		driver_start(w->board.virtio[i], i);
	struct state_buf b;
	state_buf_init(&b);
	board_save(&w->board, &b);
	if (state_finish(&b) || b.len > 0xffff)
		abort();
	uint8_t len[2];
	put_le16(len, (uint16_t)b.len);
	FILE *f = fopen(out, "wb");
	if (!f || fwrite(len, 2, 1, f) != 1 || fwrite(b.p, b.len, 1, f) != 1 || fclose(f))
		abort();
	state_buf_free(&b);
	_exit(0); /* exit() would be a fuzz target error to libFuzzer */
}

static struct rs_world *world(void)
{
	static struct rs_world w;
	static struct disk_opt disk;
	static bool ready;
	if (ready)
		return &w;
	snprintf(w.dir, sizeof(w.dir), "%s/cove-fuzz-restore-XXXXXX",
		 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
	if (!mkdtemp(w.dir) || guest_mem_create(&w.mem, MEM) || host_fake_init(&w.hf, &w.mem))
		abort();
	w.hf.log.level = LOG_ERROR;
	w.hf.on_dirty = check_ram;
	w.hf.dirty_opaque = &w.mem;
	if (board_create(&w.board, &w.hf.host, -1))
		abort();
	/* A disk under a copy-on-write overlay: synchronous I/O, no io_uring needed. */
	snprintf(disk.path, sizeof(disk.path), "%s/base", w.dir);
	snprintf(disk.overlay, sizeof(disk.overlay), "%s/ovl", w.dir);
	char uds[120];
	snprintf(uds, sizeof(uds), "%s/v.sock", w.dir);
	const struct device_type *rng = device_type_find("virtio-rng");
	_Alignas(8) unsigned char rng_cfg[DEVICE_CFG_BYTES];
	char err[256];
	if (make_file(disk.path, 1 << 20) ||
	    board_add(&w.board, &w.hf.host, &virtio_blk_type,
		      &(struct virtio_blk_cfg){.disk = &disk}) ||
	    board_add(&w.board, &w.hf.host, &virtio_vsock_type,
		      &(struct virtio_vsock_cfg){.cid = 3, .uds_path = uds}) ||
	    !rng || rng->opt_parse(NULL, rng_cfg, err, sizeof(err)) ||
	    board_add(&w.board, &w.hf.host, rng, rng_cfg))
		abort();
	const char *seed = getenv("COVE_FUZZ_WRITE_SEED");
	if (seed)
		write_seed(&w, seed);
	ready = true;
	return &w;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct rs_world *w = world();
	struct fuzz_in in = {data, size};
	size_t slen, got;
	const uint8_t *sp = fuzz_bytes(&in, fuzz_u16(&in), &slen);
	uint8_t *st = malloc(slen ? slen : 1);
	if (!st)
		return 0;
	memcpy(st, sp, slen);
	if (slen >= STATE_HDR_SIZE) {
		put_le32(st + 24, crc32_update(0, st + STATE_HDR_SIZE, slen - STATE_HDR_SIZE));
		put_le32(st + 28, crc32_update(0, st, 28));
	}
	uint8_t *ram = guest_mem_ptr(&w->mem, 0, RING_AREA);
	memset(ram, 0, RING_AREA);
	const uint8_t *rp = fuzz_bytes(&in, RING_AREA, &got);
	memcpy(ram, rp, got);

	struct state_section_ref *secs = NULL;
	size_t n = 0;
	char err[512] = "";
	if (state_parse(st, slen, &secs, &n, err, sizeof(err)) == 0) {
		int r = board_restore(&w->board, secs, n, err, sizeof(err));
		if (r == 0) {
			board_resume_restored(&w->board, &w->hf.log);
			settle(w);
			uint8_t b[4];
			for (int i = 0; i < w->board.nr_virtio; i++) {
				struct virtio_mmio *t = w->board.virtio[i];
				for (uint64_t off = 0; off < 0x140; off += 4)
					virtio_mmio_read(t, off, b, 4);
				for (uint32_t q = 0; q < VIRTIO_MMIO_MAX_QUEUES; q++)
					mwr(t, 0x050, q);
			}
			settle(w);
			/* The legacy devices: the guest reads and writes their ports. */
			static const uint16_t ports[] = {0x3f8, 0x3f9, 0x3fa, 0x3fb, 0x3fc, 0x3fd,
							 0x3fe, 0x3ff, 0x60,  0x64,  0x70,  0x71};
			for (size_t i = 0; i < sizeof(ports) / sizeof(ports[0]); i++)
				(void)host_fake_in(&w->hf, ports[i]);
			for (size_t i = 0; i < sizeof(ports) / sizeof(ports[0]); i++)
				host_fake_out(&w->hf, ports[i], (uint8_t)(slen >> (i % 8)));
		} else if (r != -EINVAL || !err[0] || strchr(err, '\n')) {
			abort(); /* a refusal is one line */
		}
	}
	free(secs);
	free(st);
	reset_all(w);
	return 0;
}
