/*
 * A fake machine for device unit tests: real buses and an event loop nobody runs, a logger on
 * stderr, and callbacks that record interrupts, stops, panics and dirty pages.
 */
#ifndef COVE_TEST_HOST_FAKE_H
#define COVE_TEST_HOST_FAKE_H

#include <stdio.h>
#include <string.h>

#include "devices/virtio_mmio.h"
#include "vmm/vm_host.h"

#define HOST_FAKE_IRQS 16

struct host_fake {
	struct vm_host host;
	struct logger log;
	struct bus pio, mmio;
	struct evloop loop;
	int irq_level[HOST_FAKE_IRQS];	/* each line's level as last driven */
	int irq_raises[HOST_FAKE_IRQS]; /* 0 -> 1 transitions */
	int stops;
	char stop_reason[128];
	char panic[128];
	/* Where device writes to guest memory are reported (NULL: nowhere). */
	void (*on_dirty)(void *opaque, uint64_t gpa, uint64_t len);
	void *dirty_opaque;
	/* Ranges given back (discard): the real guest_mem_discard, then on_dirty. */
	uint64_t discards, discarded_bytes;
	int discard_err; /* nonzero: every discard fails with it */
};

static inline int host_fake_set_irq(void *ctx, uint32_t irq, int level)
{
	struct host_fake *f = ctx;
	if (irq < HOST_FAKE_IRQS) {
		f->irq_raises[irq] += level && !f->irq_level[irq];
		f->irq_level[irq] = level;
	}
	return 0;
}

static inline void host_fake_mark_dirty(void *ctx, uint64_t gpa, uint64_t len)
{
	struct host_fake *f = ctx;
	if (f->on_dirty)
		f->on_dirty(f->dirty_opaque, gpa, len);
}

static inline void host_fake_request_stop(void *ctx, int status, const char *reason)
{
	struct host_fake *f = ctx;
	(void)status;
	f->stops++;
	snprintf(f->stop_reason, sizeof(f->stop_reason), "%s", reason);
}

static inline void host_fake_note_panic(void *ctx, const char *line)
{
	struct host_fake *f = ctx;
	snprintf(f->panic, sizeof(f->panic), "%s", line);
}

/* No KVM: the eventfds stay plain eventfds the test may read or write itself. */
static inline int host_fake_irqfd(void *ctx, int fd, uint32_t gsi, bool assign)
{
	(void)ctx, (void)fd, (void)gsi, (void)assign;
	return 0;
}

static inline int host_fake_ioeventfd(void *ctx, int fd, uint64_t addr, uint32_t datamatch,
				      bool assign)
{
	(void)ctx, (void)fd, (void)addr, (void)datamatch, (void)assign;
	return 0;
}

static inline int host_fake_discard(void *ctx, uint64_t gpa, uint64_t len)
{
	struct host_fake *f = ctx;
	if (f->discard_err)
		return f->discard_err;
	int r = guest_mem_discard(f->host.mem, gpa, len);
	if (r)
		return r;
	f->discards++;
	f->discarded_bytes += len;
	if (f->on_dirty)
		f->on_dirty(f->dirty_opaque, gpa, len);
	return 0;
}

/* Fills `f` for guest memory `mem` (may be NULL for port devices). 0 or -errno. */
static inline int host_fake_init(struct host_fake *f, const struct guest_mem *mem)
{
	memset(f, 0, sizeof(*f));
	f->log = (struct logger){.level = LOG_WARN, .out = stderr};
	bus_init(&f->pio, "pio");
	bus_init(&f->mmio, "mmio");
	int r = evloop_init(&f->loop);
	if (r)
		return r;
	/* In struct order; every entry has its own signature, so a slip does not compile. */
	static const struct vm_host_ops ops = {
	    host_fake_set_irq, host_fake_mark_dirty, host_fake_request_stop, host_fake_note_panic,
	    host_fake_irqfd,   host_fake_ioeventfd,  host_fake_discard};
	f->host = (struct vm_host){
	    .ctx = f,
	    .ops = &ops,
	    .log = &f->log,
	    .mem = mem,
	    .pio = &f->pio,
	    .mmio = &f->mmio,
	    .loop = &f->loop,
	};
	return 0;
}

/* A guest's one-byte IN/OUT on the fake port bus (0xff where nothing answers, as on a PC). */
static inline uint8_t host_fake_in(struct host_fake *f, uint64_t port)
{
	uint8_t v = 0xff;
	bus_read(&f->pio, port, &v, 1);
	return v;
}

static inline void host_fake_out(struct host_fake *f, uint64_t port, uint8_t v)
{
	bus_write(&f->pio, port, &v, 1);
}

static inline void virtio_fake_write(struct virtio_mmio *t, uint64_t off, uint32_t v)
{
	virtio_mmio_write(t, off, (const uint8_t *)&v, 4);
}

/*
 * What a driver does to bring up a device with VERSION_1: queues 0..nq-1 of `qsize` entries,
 * queue q's rings at desc/avail/used + q * stride.
 */
static inline void virtio_fake_driver_ready(struct virtio_mmio *t, uint32_t nq, uint32_t qsize,
					    uint64_t desc, uint64_t avail, uint64_t used,
					    uint64_t stride)
{
	const uint32_t ack_drv = VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER;
	virtio_fake_write(t, 0x070, ack_drv);
	virtio_fake_write(t, 0x024, 1);
	virtio_fake_write(t, 0x020, 1); /* VERSION_1 */
	virtio_fake_write(t, 0x070, ack_drv | VIRTIO_STATUS_FEATURES_OK);
	for (uint32_t q = 0; q < nq; q++) {
		virtio_fake_write(t, 0x030, q);
		virtio_fake_write(t, 0x038, qsize);
		virtio_fake_write(t, 0x080, (uint32_t)(desc + q * stride));
		virtio_fake_write(t, 0x090, (uint32_t)(avail + q * stride));
		virtio_fake_write(t, 0x0a0, (uint32_t)(used + q * stride));
		virtio_fake_write(t, 0x044, 1);
	}
	virtio_fake_write(t, 0x070, ack_drv | VIRTIO_STATUS_FEATURES_OK | VIRTIO_STATUS_DRIVER_OK);
}

static inline void host_fake_destroy(struct host_fake *f)
{
	evloop_destroy(&f->loop);
}

#endif
