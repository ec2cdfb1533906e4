/* virtio-mmio (v2) transport: registers, features, ioeventfd/irqfd; devices add an ops table. */
#ifndef COVE_VIRTIO_MMIO_H
#define COVE_VIRTIO_MMIO_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "devices/virtqueue.h"
#include "vmm/vm_host.h"

struct virtio_mmio;

#define VIRTIO_MMIO_BASE       0xd0000000ULL
#define VIRTIO_MMIO_SIZE       0x1000ULL
#define VIRTIO_MMIO_MAX_QUEUES 8

#define VIRTIO_F_RING_INDIRECT_DESC (1ULL << 28)
#define VIRTIO_F_RING_EVENT_IDX	    (1ULL << 29)
#define VIRTIO_F_VERSION_1	    (1ULL << 32)

#define VIRTIO_STATUS_ACKNOWLEDGE 1
#define VIRTIO_STATUS_DRIVER	  2
#define VIRTIO_STATUS_DRIVER_OK	  4
#define VIRTIO_STATUS_FEATURES_OK 8
#define VIRTIO_STATUS_NEEDS_RESET 64
#define VIRTIO_STATUS_FAILED	  128

#define VIRTIO_INT_USED	  1
#define VIRTIO_INT_CONFIG 2

/*
 * What a device supplies.  Every callback runs with the transport lock held
 * (on a vCPU thread for config/reset, on the event loop for notify), so a
 * device needs no locking of its own for state it touches only from here.
 */
struct virtio_dev_ops {
	const char *name;
	uint32_t device_id;
	uint64_t features; /* device features; the transport adds VERSION_1 */
	uint32_t nr_queues;
	uint32_t config_size;
	void (*config_read)(void *dev, uint32_t off, uint8_t *data, uint32_t len);
	void (*config_write)(void *dev, uint32_t off, const uint8_t *data, uint32_t len);
	/* The driver kicked queue `q` (which is ready and DRIVER_OK is set). */
	void (*queue_notify)(void *dev, struct virtio_mmio *t, uint32_t q);
	/* The driver reset the device: forget in-flight work and negotiated state. */
	void (*reset)(void *dev);
};

struct virtio_mmio {
	pthread_mutex_t lock;
	const struct vm_host *host;
	const struct guest_mem *mem;
	const struct virtio_dev_ops *ops;
	void *dev;
	uint64_t base;
	uint32_t irq;
	int irq_efd;				/* irqfd on `irq` */
	int notify_efd[VIRTIO_MMIO_MAX_QUEUES]; /* KVM ioeventfds on QueueNotify, one per queue */
	bool irqfd_registered;
	bool ioeventfd_registered[VIRTIO_MMIO_MAX_QUEUES];
	bool watched[VIRTIO_MMIO_MAX_QUEUES];

	/* Register state, protected by lock. */
	uint32_t status;
	uint32_t dev_features_sel, drv_features_sel;
	uint64_t driver_features;
	uint32_t queue_sel;
	uint32_t interrupt_status;
	uint32_t config_generation;
	struct virtq queues[VIRTIO_MMIO_MAX_QUEUES];
	uint32_t deferred; /* queues the device deferred (bit q; a reset clears it), for tests */
	uint64_t kicks, interrupts, deferrals; /* counters for logs and tests */
};

/*
 * Chains a device serves per notification before it yields: one full ring. A guest that keeps
 * its ring full then costs the event loop at most this much work between other events.
 */
#define VIRTIO_NOTIFY_BUDGET VIRTQ_MAX_SIZE

/*
 * Registers the device at `base` on the host's MMIO bus with interrupt line `irq`, wires an
 * irqfd and one ioeventfd per queue and watches the notify eventfds on the host's loop.
 */
int virtio_mmio_create(struct virtio_mmio *t, const struct vm_host *host, uint64_t base,
		       uint32_t irq, const struct virtio_dev_ops *ops, void *dev);
void virtio_mmio_destroy(struct virtio_mmio *t);

/* MMIO register access (what the bus calls); exposed for unit tests. */
void virtio_mmio_read(void *opaque, uint64_t off, uint8_t *data, uint32_t len);
void virtio_mmio_write(void *opaque, uint64_t off, const uint8_t *data, uint32_t len);

/* For devices, with the lock held: interrupt the driver after used buffers (honours EVENT_IDX). */
void virtio_mmio_notify_used(struct virtio_mmio *t, uint32_t q);
/*
 * For devices, with the lock held: the budget ran out with work left on queue `q`. Re-signals
 * the queue's own notify eventfd, so the event loop serves every other ready fd (signals, the
 * API, other devices) before it kicks this queue again, and sets bit q of t->deferred.
 */
void virtio_mmio_defer(struct virtio_mmio *t, uint32_t q);
/* Config space changed. */
void virtio_mmio_notify_config(struct virtio_mmio *t);
/* The device hit a driver error it cannot continue from. */
void virtio_mmio_set_needs_reset(struct virtio_mmio *t);
/* Marks guest memory the device wrote as dirty (for snapshots). */
void virtio_mmio_mark_dirty(struct virtio_mmio *t, uint64_t gpa, uint64_t len);
bool virtio_mmio_has_feature(const struct virtio_mmio *t, uint64_t f);

/*
 * Appends " virtio_mmio.device=4K@0x<base>:<irq>" for each device to `cmdline`
 * (NUL-terminated, capacity `cap`).  Returns 0 or -E2BIG when the result would
 * be longer than 4095 bytes or not fit.
 */
int virtio_mmio_cmdline_append(struct virtio_mmio *const *devs, size_t n, char *cmdline,
			       size_t cap);

/* Snapshot state of the transport and its queues (the device's own state is separate). */
struct virtio_mmio_queue_state {
	uint16_t size, last_avail, used_idx, signalled_used;
	uint8_t ready, event_idx, indirect, signalled_valid;
	uint32_t pad;
	uint64_t desc_gpa, avail_gpa, used_gpa;
};
struct virtio_mmio_state {
	uint32_t version, device_id, nr_queues, status;
	uint32_t dev_features_sel, drv_features_sel, queue_sel, interrupt_status;
	uint32_t config_generation, pad;
	uint64_t driver_features;
	struct virtio_mmio_queue_state q[VIRTIO_MMIO_MAX_QUEUES];
};
void virtio_mmio_save(struct virtio_mmio *t, struct virtio_mmio_state *st);
/*
 * Checks everything against this device (id, queue count, features offered, ring layout in
 * guest RAM) before taking any of it. 0 or -EINVAL with a reason in `err`.
 */
int virtio_mmio_restore(struct virtio_mmio *t, const struct virtio_mmio_state *st, char *err,
			size_t errlen);
/* After a restore: look at every ready queue once, as if the driver had kicked it. */
void virtio_mmio_kick_all(struct virtio_mmio *t);
/*
 * After a restore, before anything is pushed: an interrupt the device raised just before the
 * snapshot may never have reached the saved irqchip (an irqfd injects asynchronously), and with
 * EVENT_IDX the device would then wait for a used_event the guest never moves: its queues go
 * quiet for good. So the next notification of every queue is unconditional, and a driver that
 * is running gets one interrupt now (a spurious one is harmless: it reads InterruptStatus).
 */
void virtio_mmio_resume_restored(struct virtio_mmio *t);

#endif
