/* The x86 board: COM1, the i8042 and the CMOS clock on the port bus; the only file that names them. */
#include "devices/board.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devices/disk_spec.h"
#include "devices/virtio_blk.h"
#include "devices/virtio_vsock.h"
#include "vmm/vm.h"

/*
 * ISA interrupt lines free on this board (COM1 = 4, i8042 = 1, PIT = 0/2,
 * CMOS = 8, 13 = FPU): virtio-mmio slot n uses entry n and sits at
 * VIRTIO_MMIO_BASE + n * 4K.
 */
static const uint32_t virtio_irqs[BOARD_MAX_VIRTIO] = { 5, 6, 7, 9, 10, 11, 12, 14, 15 };

int board_create(struct board *b, struct vm *vm, int console_fd)
{
	b->nr_disks = 0;
	b->nr_virtio = 0;
	b->vsock = NULL;
	int r = serial_create(&b->com1, vm, console_fd);
	if (r) {
		log_err(vm->log, "cannot register serial port: %d", r);
		return r;
	}
	r = i8042_create(&b->kbd, vm);
	if (r) {
		log_err(vm->log, "cannot register i8042: %d", r);
		serial_destroy(&b->com1);
		return r;
	}
	r = cmos_rtc_create(&b->rtc, vm);
	if (r) {
		log_err(vm->log, "cannot register CMOS clock: %d", r);
		i8042_destroy(&b->kbd);
		serial_destroy(&b->com1);
		return r;
	}
	vm->reset_dev = &b->kbd;
	vm->send_ctrl_alt_del = i8042_send_ctrl_alt_del;
	return 0;
}

int board_add_disks(struct board *b, struct vm *vm, const struct disk_opt *disks,
		    const struct disk_chain *chains, int n)
{
	for (int i = 0; i < n; i++) {
		if (b->nr_disks >= BOARD_MAX_DISKS || b->nr_virtio >= BOARD_MAX_VIRTIO)
			return -ENOSPC;
		struct virtio_blk *blk = calloc(1, sizeof(*blk));
		if (!blk)
			return -ENOMEM;
		int slot = b->nr_virtio;
		char serial[VIRTIO_BLK_ID_BYTES + 1];
		snprintf(serial, sizeof(serial), "cove-vd%c", 'a' + b->nr_disks);
		const char *layers[BOARD_DISK_LAYERS];
		int nl = chains ? chains[i].n : 0;
		for (int k = 0; k < nl && k < BOARD_DISK_LAYERS; k++)
			layers[k] = chains[i].paths[k];
		int r = virtio_blk_create(blk, vm, disks[i].path, disks[i].read_only,
					  disks[i].overlay[0] ? disks[i].overlay : NULL, layers, nl,
					  VIRTIO_MMIO_BASE + (uint64_t)slot * VIRTIO_MMIO_SIZE,
					  virtio_irqs[slot], serial);
		if (r) {
			free(blk);
			return r;
		}
		b->disks[b->nr_disks++] = blk;
		b->virtio[b->nr_virtio++] = &blk->mmio;
	}
	return 0;
}

int board_add_vsock(struct board *b, struct vm *vm, uint64_t cid, const char *uds_path)
{
	if (b->vsock || b->nr_virtio >= BOARD_MAX_VIRTIO)
		return -ENOSPC;
	struct virtio_vsock *v = calloc(1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	int slot = b->nr_virtio;
	int r = virtio_vsock_create(v, vm, &vm->mem, cid, uds_path,
				    VIRTIO_MMIO_BASE + (uint64_t)slot * VIRTIO_MMIO_SIZE,
				    virtio_irqs[slot]);
	if (r) {
		free(v);
		return r;
	}
	b->vsock = v;
	b->virtio[b->nr_virtio++] = &v->mmio;
	return 0;
}

int board_cmdline(const struct board *b, const char *base, char *out, size_t cap)
{
	size_t len = strlen(base);
	if (len >= cap || len > 4095)
		return -E2BIG;
	memcpy(out, base, len + 1);
	return virtio_mmio_cmdline_append(b->virtio, (size_t)b->nr_virtio, out, cap);
}

void board_destroy(struct board *b)
{
	if (b->vsock) {
		virtio_vsock_destroy(b->vsock);
		free(b->vsock);
		b->vsock = NULL;
	}
	for (int i = b->nr_disks - 1; i >= 0; i--) {
		virtio_blk_destroy(b->disks[i]);
		free(b->disks[i]);
	}
	b->nr_disks = b->nr_virtio = 0;
	cmos_rtc_destroy(&b->rtc);
	i8042_destroy(&b->kbd);
	serial_destroy(&b->com1);
}
