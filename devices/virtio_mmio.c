/* virtio-mmio v2 transport: registers, negotiation, KVM eventfd wiring, once for all devices. */
#include "devices/virtio_mmio.h"

#include "common/errmsg.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>


#define REG_MAGIC		0x000
#define REG_VERSION		0x004
#define REG_DEVICE_ID		0x008
#define REG_VENDOR_ID		0x00c
#define REG_DEVICE_FEATURES	0x010
#define REG_DEVICE_FEATURES_SEL 0x014
#define REG_DRIVER_FEATURES	0x020
#define REG_DRIVER_FEATURES_SEL 0x024
#define REG_QUEUE_SEL		0x030
#define REG_QUEUE_NUM_MAX	0x034
#define REG_QUEUE_NUM		0x038
#define REG_QUEUE_READY		0x044
#define REG_QUEUE_NOTIFY	0x050
#define REG_INTERRUPT_STATUS	0x060
#define REG_INTERRUPT_ACK	0x064
#define REG_STATUS		0x070
#define REG_QUEUE_DESC_LOW	0x080
#define REG_QUEUE_DESC_HIGH	0x084
#define REG_QUEUE_DRIVER_LOW	0x090
#define REG_QUEUE_DRIVER_HIGH	0x094
#define REG_QUEUE_DEVICE_LOW	0x0a0
#define REG_QUEUE_DEVICE_HIGH	0x0a4
#define REG_CONFIG_GENERATION	0x0fc
#define REG_CONFIG		0x100

#define VIRTIO_MMIO_MAGIC  0x74726976 /* "virt" */
#define VIRTIO_MMIO_VENDOR 0x45564f43 /* "COVE" */

#define STATUS_KNOWN                                                                               \
	(VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_DRIVER_OK |              \
	 VIRTIO_STATUS_FEATURES_OK | VIRTIO_STATUS_NEEDS_RESET | VIRTIO_STATUS_FAILED)

static uint64_t offered_features(const struct virtio_mmio *t)
{
	return t->ops->features | VIRTIO_F_VERSION_1;
}

bool virtio_mmio_has_feature(const struct virtio_mmio *t, uint64_t f)
{
	return (t->driver_features & f) == f;
}

void virtio_mmio_mark_dirty(struct virtio_mmio *t, uint64_t gpa, uint64_t len)
{
	t->host->ops->mark_dirty(t->host->ctx, gpa, len);
}

static void queue_mark_dirty(void *opaque, uint64_t gpa, uint64_t len)
{
	virtio_mmio_mark_dirty(opaque, gpa, len);
}

static void raise_irq(struct virtio_mmio *t, uint32_t bits)
{
	t->interrupt_status |= bits;
	t->interrupts++;
	if (t->irq_efd >= 0) {
		uint64_t one = 1;
		/* The counter only saturates after 2^64-2 unread writes; the guest acks long
		 * before. */
		if (write(t->irq_efd, &one, sizeof(one)) < 0)
			log_warn(t->host->log, "%s: irqfd write: %s", t->ops->name,
				 strerror(errno));
	}
}

void virtio_mmio_notify_used(struct virtio_mmio *t, uint32_t q)
{
	if (q < t->ops->nr_queues && virtq_should_notify(&t->queues[q]))
		raise_irq(t, VIRTIO_INT_USED);
}

void virtio_mmio_defer(struct virtio_mmio *t, uint32_t q)
{
	if (q >= t->ops->nr_queues)
		return;
	t->deferrals++;
	t->deferred |= 1u << q;
	uint64_t one = 1;
	/* Nonblocking: a full counter only means a kick is already pending. */
	if (write(t->notify_efd[q], &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_warn(t->host->log, "%s: notify eventfd write: %s", t->ops->name,
			 strerror(errno));
}

void virtio_mmio_notify_config(struct virtio_mmio *t)
{
	t->config_generation++;
	if (t->status & VIRTIO_STATUS_DRIVER_OK)
		raise_irq(t, VIRTIO_INT_CONFIG);
}

void virtio_mmio_set_needs_reset(struct virtio_mmio *t)
{
	if (t->status & VIRTIO_STATUS_NEEDS_RESET)
		return;
	log_warn(t->host->log, "%s@0x%llx: driver error, device needs reset", t->ops->name,
		 (unsigned long long)t->base);
	t->status |= VIRTIO_STATUS_NEEDS_RESET;
	virtio_mmio_notify_config(t);
}

static void device_reset(struct virtio_mmio *t)
{
	if (t->ops->reset)
		t->ops->reset(t->dev);
	for (uint32_t i = 0; i < VIRTIO_MMIO_MAX_QUEUES; i++)
		virtq_reset(&t->queues[i]);
	t->status = 0;
	t->dev_features_sel = t->drv_features_sel = 0;
	t->driver_features = 0;
	t->queue_sel = 0;
	t->interrupt_status = 0;
	t->deferred = 0;
}

static struct virtq *selected_queue(struct virtio_mmio *t)
{
	return t->queue_sel < t->ops->nr_queues ? &t->queues[t->queue_sel] : NULL;
}

/* Called with the lock held. */
static void kick(struct virtio_mmio *t, uint32_t q)
{
	t->kicks++;
	if (q >= t->ops->nr_queues || !t->queues[q].ready)
		return;
	if (!(t->status & VIRTIO_STATUS_DRIVER_OK) || (t->status & VIRTIO_STATUS_NEEDS_RESET))
		return;
	if (t->ops->queue_notify)
		t->ops->queue_notify(t->dev, t, q);
}

static void set_status(struct virtio_mmio *t, uint32_t v)
{
	if (v == 0) {
		device_reset(t);
		return;
	}
	/* FEATURES_OK sticks only if what the driver chose is sane. */
	if ((v & VIRTIO_STATUS_FEATURES_OK) && !(t->status & VIRTIO_STATUS_FEATURES_OK)) {
		uint64_t f = t->driver_features;
		if ((f & ~offered_features(t)) || !(f & VIRTIO_F_VERSION_1))
			v &= ~(uint32_t)VIRTIO_STATUS_FEATURES_OK;
	}
	/*
	 * Only bits the spec defines, and DRIVER_OK only on top of FEATURES_OK: restore refuses
	 * any other status, so a guest must not be able to leave one in a snapshot.
	 */
	v &= STATUS_KNOWN & ~(uint32_t)VIRTIO_STATUS_NEEDS_RESET;
	if (!(v & VIRTIO_STATUS_FEATURES_OK))
		v &= ~(uint32_t)VIRTIO_STATUS_DRIVER_OK;
	t->status = (t->status & VIRTIO_STATUS_NEEDS_RESET) | v;
}

static void queue_ready(struct virtio_mmio *t, struct virtq *q, uint32_t v)
{
	if (!v) {
		q->ready = false;
		return;
	}
	if (q->ready)
		return;
	q->event_idx = virtio_mmio_has_feature(t, VIRTIO_F_RING_EVENT_IDX);
	q->indirect = virtio_mmio_has_feature(t, VIRTIO_F_RING_INDIRECT_DESC);
	if (virtq_check_layout(q)) {
		virtio_mmio_set_needs_reset(t);
		return;
	}
	q->last_avail = q->used_idx = q->signalled_used = 0;
	q->signalled_valid = false;
	q->ready = true;
}

static uint32_t read_reg(struct virtio_mmio *t, uint64_t off)
{
	struct virtq *q = selected_queue(t);
	switch (off) {
	case REG_MAGIC:
		return VIRTIO_MMIO_MAGIC;
	case REG_VERSION:
		return 2;
	case REG_DEVICE_ID:
		return t->ops->device_id;
	case REG_VENDOR_ID:
		return VIRTIO_MMIO_VENDOR;
	case REG_DEVICE_FEATURES:
		if (t->dev_features_sel > 1)
			return 0;
		return (uint32_t)(offered_features(t) >> (32 * t->dev_features_sel));
	case REG_QUEUE_NUM_MAX:
		return q ? VIRTQ_MAX_SIZE : 0;
	case REG_QUEUE_READY:
		return q ? q->ready : 0;
	case REG_INTERRUPT_STATUS:
		return t->interrupt_status;
	case REG_STATUS:
		return t->status;
	case REG_CONFIG_GENERATION:
		return t->config_generation;
	}
	return 0;
}

static void set_low(uint64_t *v, uint32_t x)
{
	*v = (*v & ~0xffffffffULL) | x;
}

static void set_high(uint64_t *v, uint32_t x)
{
	*v = (*v & 0xffffffffULL) | ((uint64_t)x << 32);
}

static void write_reg(struct virtio_mmio *t, uint64_t off, uint32_t v)
{
	struct virtq *q = selected_queue(t);
	/* Queue layout may change only while the queue is not ready. */
	bool q_writable = q && !q->ready;
	switch (off) {
	case REG_DEVICE_FEATURES_SEL:
		t->dev_features_sel = v;
		return;
	case REG_DRIVER_FEATURES:
		if (t->status & VIRTIO_STATUS_FEATURES_OK)
			return;
		if (t->drv_features_sel == 0)
			set_low(&t->driver_features, v);
		else if (t->drv_features_sel == 1)
			set_high(&t->driver_features, v);
		return;
	case REG_DRIVER_FEATURES_SEL:
		t->drv_features_sel = v;
		return;
	case REG_QUEUE_SEL:
		t->queue_sel = v;
		return;
	case REG_QUEUE_NUM:
		if (q_writable)
			q->size = v > 0xffff ? 0 : (uint16_t)v;
		return;
	case REG_QUEUE_READY:
		if (q)
			queue_ready(t, q, v);
		return;
	case REG_QUEUE_NOTIFY:
		/* Normally KVM's ioeventfd takes these; a write it did not match lands here. */
		kick(t, v & 0xffff);
		return;
	case REG_INTERRUPT_ACK:
		t->interrupt_status &= ~v;
		return;
	case REG_STATUS:
		set_status(t, v);
		return;
	case REG_QUEUE_DESC_LOW:
		if (q_writable)
			set_low(&q->desc_gpa, v);
		return;
	case REG_QUEUE_DESC_HIGH:
		if (q_writable)
			set_high(&q->desc_gpa, v);
		return;
	case REG_QUEUE_DRIVER_LOW:
		if (q_writable)
			set_low(&q->avail_gpa, v);
		return;
	case REG_QUEUE_DRIVER_HIGH:
		if (q_writable)
			set_high(&q->avail_gpa, v);
		return;
	case REG_QUEUE_DEVICE_LOW:
		if (q_writable)
			set_low(&q->used_gpa, v);
		return;
	case REG_QUEUE_DEVICE_HIGH:
		if (q_writable)
			set_high(&q->used_gpa, v);
		return;
	}
}

void virtio_mmio_read(void *opaque, uint64_t off, uint8_t *data, uint32_t len)
{
	struct virtio_mmio *t = opaque;
	memset(data, 0, len);
	pthread_mutex_lock(&t->lock);
	if (off >= REG_CONFIG) {
		uint64_t c = off - REG_CONFIG;
		if (c < t->ops->config_size && len <= t->ops->config_size - c &&
		    t->ops->config_read)
			t->ops->config_read(t->dev, (uint32_t)c, data, len);
	} else if (len == 4 && !(off & 3)) {
		uint32_t v = read_reg(t, off);
		memcpy(data, &v, 4);
	}
	pthread_mutex_unlock(&t->lock);
}

void virtio_mmio_write(void *opaque, uint64_t off, const uint8_t *data, uint32_t len)
{
	struct virtio_mmio *t = opaque;
	pthread_mutex_lock(&t->lock);
	if (off >= REG_CONFIG) {
		uint64_t c = off - REG_CONFIG;
		if (c < t->ops->config_size && len <= t->ops->config_size - c &&
		    t->ops->config_write)
			t->ops->config_write(t->dev, (uint32_t)c, data, len);
	} else if (len == 4 && !(off & 3)) {
		uint32_t v;
		memcpy(&v, data, 4);
		write_reg(t, off, v);
	}
	pthread_mutex_unlock(&t->lock);
}

static const struct io_ops virtio_mmio_ops = {
    .name = "virtio-mmio",
    .read = virtio_mmio_read,
    .write = virtio_mmio_write,
};

/* One eventfd per queue so a kick names its queue without a VM exit. */
static void on_notify(void *opaque, uint32_t events)
{
	struct virtio_mmio *t = opaque;
	(void)events;
	pthread_mutex_lock(&t->lock);
	for (uint32_t q = 0; q < t->ops->nr_queues; q++) {
		uint64_t v;
		if (read(t->notify_efd[q], &v, sizeof(v)) == sizeof(v))
			kick(t, q);
	}
	pthread_mutex_unlock(&t->lock);
}

static int ioeventfd(struct virtio_mmio *t, uint32_t q, bool assign)
{
	return t->host->ops->ioeventfd(t->host->ctx, t->notify_efd[q], t->base + REG_QUEUE_NOTIFY, q,
				  assign);
}

int virtio_mmio_create(struct virtio_mmio *t, const struct vm_host *host, uint64_t base,
		       uint32_t irq, const struct virtio_dev_ops *ops, void *dev)
{
	if (ops->nr_queues == 0 || ops->nr_queues > VIRTIO_MMIO_MAX_QUEUES)
		return -EINVAL;
	memset(t, 0, sizeof(*t));
	pthread_mutex_init(&t->lock, NULL);
	t->host = host;
	t->mem = host->mem;
	t->ops = ops;
	t->dev = dev;
	t->base = base;
	t->irq = irq;
	t->irq_efd = -1;
	for (uint32_t i = 0; i < VIRTIO_MMIO_MAX_QUEUES; i++) {
		t->notify_efd[i] = -1;
		t->queues[i].mem = t->mem;
		t->queues[i].mark_dirty = queue_mark_dirty;
		t->queues[i].dirty_opaque = t;
	}

	int r;
	t->irq_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (t->irq_efd < 0) {
		r = -errno;
		goto fail;
	}
	r = host->ops->irqfd(host->ctx, t->irq_efd, irq, true);
	if (r < 0)
		goto fail;
	t->irqfd_registered = true;
	for (uint32_t q = 0; q < ops->nr_queues; q++) {
		t->notify_efd[q] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (t->notify_efd[q] < 0) {
			r = -errno;
			goto fail;
		}
		r = ioeventfd(t, q, true);
		if (r < 0)
			goto fail;
		t->ioeventfd_registered[q] = true;
		r = evloop_add(host->loop, t->notify_efd[q], EPOLLIN, on_notify, t);
		if (r < 0)
			goto fail;
		t->watched[q] = true;
	}
	r = bus_register(host->mmio, base, VIRTIO_MMIO_SIZE, &virtio_mmio_ops, t);
	if (r < 0)
		goto fail;
	return 0;
fail:
	log_err(host->log, "%s: cannot set up virtio-mmio at 0x%llx irq %u: %s", ops->name,
		(unsigned long long)base, irq, strerror(-r));
	virtio_mmio_destroy(t);
	return r;
}

void virtio_mmio_destroy(struct virtio_mmio *t)
{
	for (uint32_t q = 0; q < VIRTIO_MMIO_MAX_QUEUES; q++) {
		if (t->watched[q])
			evloop_del(t->host->loop, t->notify_efd[q]);
		if (t->ioeventfd_registered[q])
			ioeventfd(t, q, false);
		if (t->notify_efd[q] >= 0)
			close(t->notify_efd[q]);
		t->watched[q] = t->ioeventfd_registered[q] = false;
		t->notify_efd[q] = -1;
	}
	if (t->irq_efd >= 0) {
		if (t->irqfd_registered)
			t->host->ops->irqfd(t->host->ctx, t->irq_efd, t->irq, false);
		t->irqfd_registered = false;
		close(t->irq_efd);
		t->irq_efd = -1;
	}
	pthread_mutex_destroy(&t->lock);
}

int virtio_mmio_cmdline_append(struct virtio_mmio *const *devs, size_t n, char *cmdline, size_t cap)
{
	size_t len = strnlen(cmdline, cap);
	if (len >= cap)
		return -E2BIG;
	for (size_t i = 0; i < n; i++) {
		char word[80];
		int w = snprintf(word, sizeof(word), "%svirtio_mmio.device=4K@0x%llx:%u",
				 len ? " " : "", (unsigned long long)devs[i]->base, devs[i]->irq);
		if (w < 0 || (size_t)w >= sizeof(word) || len + (size_t)w > 4095 ||
		    len + (size_t)w >= cap)
			return -E2BIG;
		memcpy(cmdline + len, word, (size_t)w + 1);
		len += (size_t)w;
	}
	return 0;
}

void virtio_mmio_save(struct virtio_mmio *t, struct virtio_mmio_state *st)
{
	memset(st, 0, sizeof(*st));
	pthread_mutex_lock(&t->lock);
	st->version = 1;
	st->device_id = t->ops->device_id;
	st->nr_queues = t->ops->nr_queues;
	st->status = t->status;
	st->dev_features_sel = t->dev_features_sel;
	st->drv_features_sel = t->drv_features_sel;
	st->queue_sel = t->queue_sel;
	st->interrupt_status = t->interrupt_status;
	st->config_generation = t->config_generation;
	st->driver_features = t->driver_features;
	for (uint32_t i = 0; i < t->ops->nr_queues; i++) {
		const struct virtq *q = &t->queues[i];
		struct virtio_mmio_queue_state *qs = &st->q[i];
		qs->size = q->size;
		qs->last_avail = q->last_avail;
		qs->used_idx = q->used_idx;
		qs->signalled_used = q->signalled_used;
		qs->ready = q->ready;
		qs->event_idx = q->event_idx;
		qs->indirect = q->indirect;
		qs->signalled_valid = q->signalled_valid;
		qs->desc_gpa = q->desc_gpa;
		qs->avail_gpa = q->avail_gpa;
		qs->used_gpa = q->used_gpa;
	}
	pthread_mutex_unlock(&t->lock);
}

/* The status and feature rules set_status() and REG_DRIVER_FEATURES apply to a live driver. */
static int check_saved_status(const struct virtio_mmio *t, const struct virtio_mmio_state *st,
			      char *err, size_t errlen)
{
	const char *name = t->ops->name;
	/* Before FEATURES_OK the driver may hold any bits; set_status() checks them then. */
	if ((st->status & VIRTIO_STATUS_FEATURES_OK) &&
	    (st->driver_features & ~offered_features(t)))
		return errmsg(err, errlen, -EINVAL,
			      "%s: driver_features 0x%llx has bits never offered", name,
			      (unsigned long long)st->driver_features);
	if (st->status & ~(uint32_t)STATUS_KNOWN)
		return errmsg(err, errlen, -EINVAL, "%s: status 0x%x has unknown bits", name,
			      st->status);
	if ((st->status & VIRTIO_STATUS_FEATURES_OK) && !(st->driver_features & VIRTIO_F_VERSION_1))
		return errmsg(err, errlen, -EINVAL,
			      "%s: status has FEATURES_OK without VERSION_1 negotiated", name);
	if ((st->status & VIRTIO_STATUS_DRIVER_OK) && !(st->status & VIRTIO_STATUS_FEATURES_OK))
		return errmsg(err, errlen, -EINVAL, "%s: status has DRIVER_OK without FEATURES_OK",
			      name);
	if (st->interrupt_status & ~(uint32_t)(VIRTIO_INT_USED | VIRTIO_INT_CONFIG))
		return errmsg(err, errlen, -EINVAL, "%s: interrupt_status 0x%x has unknown bits",
			      name, st->interrupt_status);
	return 0;
}

/* A queue as queue_ready() would have accepted it from the driver. */
static int check_saved_queue(const struct virtio_mmio *t, uint32_t i, const struct virtq *q,
			     char *err, size_t errlen)
{
	const char *name = t->ops->name;
	/* Not ready: the driver may still be writing it; queue_ready() checks and clears it. */
	if (!q->ready)
		return 0;
	if (q->size == 0 || q->size > VIRTQ_MAX_SIZE || (q->size & (q->size - 1)))
		return errmsg(err, errlen, -EINVAL,
			      "%s: queue %u size %u is not a power of two up to %d", name, i,
			      q->size, VIRTQ_MAX_SIZE);
	if (virtq_check_layout(q))
		return errmsg(err, errlen, -EINVAL,
			      "%s: queue %u rings are misaligned or not inside guest RAM", name, i);
	/* queue_ready() takes these from the features the driver holds at that moment. */
	if ((q->event_idx && !(offered_features(t) & VIRTIO_F_RING_EVENT_IDX)) ||
	    (q->indirect && !(offered_features(t) & VIRTIO_F_RING_INDIRECT_DESC)))
		return errmsg(err, errlen, -EINVAL,
			      "%s: queue %u uses ring features the device never offered", name, i);
	/* The device never gets ahead of what it took from the ring. */
	if ((uint16_t)(q->last_avail - q->used_idx) > q->size)
		return errmsg(err, errlen, -EINVAL,
			      "%s: queue %u has %u buffers in flight, more than its size %u", name,
			      i, (uint16_t)(q->last_avail - q->used_idx), q->size);
	return 0;
}

int virtio_mmio_restore(struct virtio_mmio *t, const struct virtio_mmio_state *st, char *err,
			size_t errlen)
{
	if (st->version != 1)
		return errmsg(err, errlen, -EINVAL, "%s: device state version %u unknown",
			      t->ops->name, st->version);
	if (st->device_id != t->ops->device_id || st->nr_queues != t->ops->nr_queues)
		return errmsg(err, errlen, -EINVAL,
			      "%s: saved device (id %u, %u queues) is not this device",
			      t->ops->name, st->device_id, st->nr_queues);
	int r = check_saved_status(t, st, err, errlen);
	if (r)
		return r;
	struct virtq qs[VIRTIO_MMIO_MAX_QUEUES];
	for (uint32_t i = 0; i < VIRTIO_MMIO_MAX_QUEUES; i++) {
		const struct virtio_mmio_queue_state *s = &st->q[i];
		if (i >= t->ops->nr_queues) {
			static const struct virtio_mmio_queue_state zero;
			if (memcmp(s, &zero, sizeof(zero)))
				return errmsg(err, errlen, -EINVAL,
					      "%s: saved queue %u does not exist on this device",
					      t->ops->name, i);
			continue;
		}
		struct virtq *q = &qs[i];
		*q = t->queues[i];
		q->size = s->size;
		q->last_avail = s->last_avail;
		q->used_idx = s->used_idx;
		q->signalled_used = s->signalled_used;
		q->ready = s->ready != 0;
		q->event_idx = s->event_idx != 0;
		q->indirect = s->indirect != 0;
		q->signalled_valid = s->signalled_valid != 0;
		q->desc_gpa = s->desc_gpa;
		q->avail_gpa = s->avail_gpa;
		q->used_gpa = s->used_gpa;
		if (s->ready > 1 || s->event_idx > 1 || s->indirect > 1 || s->signalled_valid > 1)
			return errmsg(err, errlen, -EINVAL,
				      "%s: queue %u has a flag that is not 0 or 1", t->ops->name,
				      i);
		r = check_saved_queue(t, i, q, err, errlen);
		if (r)
			return r;
	}
	pthread_mutex_lock(&t->lock);
	t->status = st->status;
	t->dev_features_sel = st->dev_features_sel;
	t->drv_features_sel = st->drv_features_sel;
	t->queue_sel = st->queue_sel;
	t->interrupt_status = st->interrupt_status;
	t->config_generation = st->config_generation;
	t->driver_features = st->driver_features;
	for (uint32_t i = 0; i < t->ops->nr_queues; i++)
		t->queues[i] = qs[i];
	pthread_mutex_unlock(&t->lock);
	return 0;
}

void virtio_mmio_resume_restored(struct virtio_mmio *t)
{
	pthread_mutex_lock(&t->lock);
	for (uint32_t q = 0; q < t->ops->nr_queues; q++)
		t->queues[q].signalled_valid = false;
	if ((t->status & VIRTIO_STATUS_DRIVER_OK) && !(t->status & VIRTIO_STATUS_NEEDS_RESET))
		raise_irq(t, VIRTIO_INT_USED);
	pthread_mutex_unlock(&t->lock);
}

void virtio_mmio_kick_all(struct virtio_mmio *t)
{
	pthread_mutex_lock(&t->lock);
	for (uint32_t q = 0; q < t->ops->nr_queues; q++)
		kick(t, q);
	pthread_mutex_unlock(&t->lock);
}
