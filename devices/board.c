/* The x86 board: COM1, the i8042 and the CMOS clock on the port bus, then table devices in virtio-mmio slots. */
#include "devices/board.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmm/vm_host.h"

/*
 * ISA interrupt lines free on this board (COM1 = 4, i8042 = 1, PIT = 0/2,
 * CMOS = 8, 13 = FPU): virtio-mmio slot n uses entry n and sits at
 * VIRTIO_MMIO_BASE + n * 4K.
 */
static const uint32_t virtio_irqs[BOARD_MAX_VIRTIO] = { 5, 6, 7, 9, 10, 11, 12, 14, 15 };

int board_create(struct board *b, struct vm_host *host, int console_fd)
{
	b->nr_virtio = 0;
	int r = serial_create(&b->com1, host, console_fd);
	if (r) {
		log_err(host->log, "cannot register serial port: %d", r);
		return r;
	}
	r = i8042_create(&b->kbd, host);
	if (r) {
		log_err(host->log, "cannot register i8042: %d", r);
		serial_destroy(&b->com1);
		return r;
	}
	r = cmos_rtc_create(&b->rtc, host);
	if (r) {
		log_err(host->log, "cannot register CMOS clock: %d", r);
		i8042_destroy(&b->kbd);
		serial_destroy(&b->com1);
		return r;
	}
	host->reset_dev = &b->kbd;
	host->send_ctrl_alt_del = i8042_send_ctrl_alt_del;
	return 0;
}

int board_add(struct board *b, const struct vm_host *host, const struct device_type *t,
	      const void *cfg)
{
	if (b->nr_virtio >= BOARD_MAX_VIRTIO)
		return -ENOSPC;
	void *dev = calloc(1, t->size);
	if (!dev)
		return -ENOMEM;
	int slot = b->nr_virtio;
	struct device_host h = {
	    .host = host,
	    .mmio_base = VIRTIO_MMIO_BASE + (uint64_t)slot * VIRTIO_MMIO_SIZE,
	    .irq = virtio_irqs[slot],
	    .index = board_count(b, t),
	};
	int r = t->create(dev, &h, cfg);
	if (r) {
		free(dev);
		return r;
	}
	b->devs[slot] = (struct board_dev){ .type = t, .dev = dev };
	b->virtio[slot] = t->mmio(dev);
	b->nr_virtio++;
	return 0;
}

int board_count(const struct board *b, const struct device_type *t)
{
	int n = 0;
	for (int i = 0; i < b->nr_virtio; i++)
		n += b->devs[i].type == t;
	return n;
}

void *board_nth(const struct board *b, const struct device_type *t, int i)
{
	for (int k = 0; k < b->nr_virtio; k++)
		if (b->devs[k].type == t && i-- == 0)
			return b->devs[k].dev;
	return NULL;
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
	for (int i = b->nr_virtio - 1; i >= 0; i--) {
		b->devs[i].type->destroy(b->devs[i].dev);
		free(b->devs[i].dev);
	}
	b->nr_virtio = 0;
	cmos_rtc_destroy(&b->rtc);
	i8042_destroy(&b->kbd);
	serial_destroy(&b->com1);
}
