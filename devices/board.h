/* The x86 board: which legacy devices a cove VM has and where they sit. */
#ifndef COVE_BOARD_H
#define COVE_BOARD_H

#include "devices/cmos_rtc.h"
#include "devices/device.h"
#include "devices/disk_spec.h"
#include "devices/i8042.h"
#include "devices/serial.h"
#include "devices/virtio_mmio.h"

struct vm_host;

#define BOARD_MAX_DISKS 8
#define BOARD_MAX_VIRTIO 9

/* One device on the board: its type (the table in device.h) and the object the board allocated. */
struct board_dev {
	const struct device_type *type;
	void *dev;
};

struct board {
	struct serial com1;
	struct i8042 kbd;
	struct cmos_rtc rtc;
	/* Table devices in slot order: base and IRQ follow from the slot; virtio[i] is devs[i]'s. */
	struct board_dev devs[BOARD_MAX_VIRTIO];
	struct virtio_mmio *virtio[BOARD_MAX_VIRTIO];
	int nr_virtio;
};

/* Creates and registers every board device; serial output goes to console_fd. */
int board_create(struct board *b, struct vm_host *host, int console_fd);
/* Frozen overlay layers under one disk's top (snapshots), oldest first. */
#define BOARD_DISK_LAYERS 15
struct disk_chain {
	int n;
	char paths[BOARD_DISK_LAYERS][4096];
};

/*
 * Adds a device of type `t` configured by `cfg` (the type's config struct) in the next
 * virtio-mmio slot. 0 or -errno (-ENOSPC when the slots are taken).
 */
int board_add(struct board *b, const struct vm_host *host, const struct device_type *t,
	      const void *cfg);
/* How many devices of type `t` the board has; the object of the i-th of them (or NULL). */
int board_count(const struct board *b, const struct device_type *t);
void *board_nth(const struct board *b, const struct device_type *t, int i);
/*
 * Copies `base` into `out` and appends the virtio_mmio.device= words the guest
 * kernel needs to find the virtio devices.  0, or -E2BIG past 4095 bytes.
 */
int board_cmdline(const struct board *b, const char *base, char *out, size_t cap);
void board_destroy(struct board *b);

#endif
