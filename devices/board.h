/* The x86 board: which legacy devices a cove VM has and where they sit. */
#ifndef COVE_BOARD_H
#define COVE_BOARD_H

#include "devices/cmos_rtc.h"
#include "devices/disk_spec.h"
#include "devices/i8042.h"
#include "devices/serial.h"
#include "devices/virtio_mmio.h"

struct vm;

#define BOARD_MAX_DISKS 8
#define BOARD_MAX_VIRTIO 9

struct virtio_blk;
struct virtio_vsock;

struct board {
	struct serial com1;
	struct i8042 kbd;
	struct cmos_rtc rtc;
	struct virtio_blk *disks[BOARD_MAX_DISKS];
	int nr_disks;
	struct virtio_vsock *vsock; /* NULL without --vsock-cid */
	struct virtio_mmio *virtio[BOARD_MAX_VIRTIO]; /* in slot order: base and IRQ follow from it */
	int nr_virtio;
};

/* Creates and registers every board device; serial output goes to console_fd. */
int board_create(struct board *b, struct vm *vm, int console_fd);
/* Frozen overlay layers under one disk's top (snapshots), oldest first. */
#define BOARD_DISK_LAYERS 15
struct disk_chain {
	int n;
	char paths[BOARD_DISK_LAYERS][4096];
};

/*
 * Adds one virtio-blk per disk, in order (the guest names them vda, vdb...); `chains` (NULL or
 * n entries) lists frozen overlay layers under each disk's overlay. 0 or -errno.
 */
int board_add_disks(struct board *b, struct vm *vm, const struct disk_opt *disks,
		    const struct disk_chain *chains, int n);
/* Adds the virtio-vsock device serving `uds_path` for guest `cid`. 0 or -errno. */
int board_add_vsock(struct board *b, struct vm *vm, uint64_t cid, const char *uds_path);
/*
 * Copies `base` into `out` and appends the virtio_mmio.device= words the guest
 * kernel needs to find the virtio devices.  0, or -E2BIG past 4095 bytes.
 */
int board_cmdline(const struct board *b, const char *base, char *out, size_t cap);
void board_destroy(struct board *b);

#endif
