/*
 * libFuzzer target: virtio-blk request handling (devices/virtio_blk.c) against fake disks, on
 * the unit tests' fake machine (tests/unit/host_fake.h). Two devices live for the whole run:
 * a plain image (io_uring) and a read-only base under a copy-on-write overlay (synchronous).
 * Each input brings the driver up, lays out queue 0 in guest memory, kicks, completes every
 * request and resets the device, so no request outlives its input.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "devices/virtio_blk.h"
#include "devices/virtqueue.h"
#include "fuzz.h"
#include "host_fake.h"
#include "vmm/guest_mem.h"

#define FZ_MEM	 (2ULL << 20)
#define FZ_DESC	 0x0000ULL
#define FZ_AVAIL 0x1000ULL
#define FZ_USED	 0x2000ULL
#define FZ_WIPE	 0x10000ULL /* guest bytes reset before each input (-max_len stays below) */
#define FZ_DISK	 (1u << 20)

struct blk_world {
	struct guest_mem mem;
	struct host_fake hf;
	struct virtio_blk plain, cow;
	bool plain_ok;
	char dir[64];
};

static void check_ram(void *opaque, uint64_t gpa, uint64_t len)
{
	const struct guest_mem *mem = opaque;
	if (len && !guest_mem_ptr(mem, gpa, len)) /* the device writes guest RAM only */
		abort();
}

static int make_file(const char *path, off_t size)
{
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	/* Some non-zero data, so reads return something. */
	static const char text[] = "cove fuzz disk sector\n";
	for (off_t off = 0; off < size; off += 4096)
		if (pwrite(fd, text, sizeof(text), off) != (ssize_t)sizeof(text))
			break;
	int r = ftruncate(fd, size);
	close(fd);
	return r;
}

static struct blk_world *world(void)
{
	static struct blk_world w;
	static bool ready;
	if (ready)
		return &w;
	char img[128], base[128], ovl[128];
	snprintf(w.dir, sizeof(w.dir), "%s/cove-fuzz-blk-XXXXXX",
		 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
	if (!mkdtemp(w.dir) || guest_mem_create(&w.mem, FZ_MEM) || host_fake_init(&w.hf, &w.mem))
		abort();
	w.hf.log.level = LOG_ERROR; /* guest mistakes are warnings: keep the output readable */
	w.hf.on_dirty = check_ram;
	w.hf.dirty_opaque = &w.mem;
	snprintf(img, sizeof(img), "%s/img", w.dir);
	snprintf(base, sizeof(base), "%s/base", w.dir);
	snprintf(ovl, sizeof(ovl), "%s/ovl", w.dir);
	if (make_file(img, FZ_DISK) || make_file(base, FZ_DISK))
		abort();
	int r = virtio_blk_create(&w.plain, &w.hf.host, img, false, NULL, NULL, 0, VIRTIO_MMIO_BASE,
				  5, "fuzz-plain");
	w.plain_ok = r == 0; /* without io_uring (-ENOSYS/-EPERM) only the overlay disk runs */
	if (r && r != -ENOSYS && r != -EPERM)
		abort();
	if (virtio_blk_create(&w.cow, &w.hf.host, base, false, ovl, NULL, 0,
			      VIRTIO_MMIO_BASE + VIRTIO_MMIO_SIZE, 6, "fuzz-overlay-serial-20+"))
		abort();
	ready = true;
	return &w;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct blk_world *w = world();
	struct fuzz_in in = {data, size};
	uint8_t shape = fuzz_u8(&in), kicks = fuzz_u8(&in);
	struct virtio_blk *blk = (shape & 0x80) || !w->plain_ok ? &w->cow : &w->plain;
	uint8_t *ram = guest_mem_ptr(&w->mem, 0, FZ_WIPE);
	memset(ram, 0, FZ_WIPE);
	size_t got;
	const uint8_t *rest = fuzz_bytes(&in, FZ_WIPE, &got);
	memcpy(ram, rest, got);

	uint32_t qsize = 1u << (1 + shape % 8); /* 2..256 */
	virtio_fake_driver_ready(&blk->mmio, 1, qsize, FZ_DESC, FZ_AVAIL, FZ_USED, 0);
	if (!(blk->mmio.status & VIRTIO_STATUS_DRIVER_OK))
		abort();
	if (shape & 0x40) {
		/* Reading the config space is part of what a guest does. */
		uint8_t cfg[8];
		for (uint64_t off = 0x100; off < 0x140; off += 4)
			virtio_mmio_read(&blk->mmio, off, cfg, 4);
	}
	for (int k = 0; k <= (kicks & 3); k++) {
		virtio_fake_write(&blk->mmio, 0x050, 0);
		virtio_blk_quiesce(blk);
		virtio_blk_poll(blk);
	}
	virtio_fake_write(&blk->mmio, 0x070, 0); /* reset: drains what is left */
	if (blk->mmio.status != 0)
		abort();
	return 0;
}
