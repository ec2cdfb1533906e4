/* virtio-rng (entropy, device id 4): fills guest buffers from getrandom(), rate-limited by a token
 * bucket. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/errmsg.h"
#include "devices/device.h"

#define VIRTIO_ID_RNG	  4
#define RNG_DEFAULT_RATE  (1ULL << 20) /* bytes per second */
#define RNG_MAX_RATE	  (1ULL << 30)
#define RNG_MAX_BURST	  (64ULL << 10)
#define RNG_STATE_VERSION 1
#define NSEC_PER_SEC	  1000000000ULL
/* Past this idle time the bucket is full whatever the rate (keeps the arithmetic small). */
#define RNG_FULL_AFTER_NS (1100ULL * NSEC_PER_SEC)

/* Bucket: `burst` bytes at most, refilled at `rate` bytes per second. */
struct rng_cfg {
	uint64_t rate, burst;
};
_Static_assert(sizeof(struct rng_cfg) <= DEVICE_CFG_BYTES, "rng config fits a device_spec");

struct virtio_rng {
	struct virtio_mmio mmio;
	const struct vm_host *host;
	struct rng_cfg cfg;
	uint64_t tokens;  /* bytes the guest may take now */
	uint64_t last_ns; /* CLOCK_MONOTONIC when tokens were last topped up */
	int timer_fd;	  /* wakes the queue when the bucket has refilled; -1 until created */
	bool watched, armed;
	struct virtq_chain chain;
	uint64_t served, throttled;
};

/* Saved with snapshots: the bucket (its config comes from the machine config and must match). */
struct virtio_rng_state {
	uint32_t version, pad;
	uint64_t rate, burst, tokens, served;
};
_Static_assert(sizeof(struct virtio_rng_state) <= DEVICE_STATE_MAX, "rng state fits");

static void bucket_refill(struct virtio_rng *r)
{
	uint64_t now = mono_ns(), dt = now - r->last_ns;
	uint64_t add = dt >= RNG_FULL_AFTER_NS
			   ? r->cfg.burst
			   : (uint64_t)((unsigned __int128)dt * r->cfg.rate / NSEC_PER_SEC);
	/* Keep the fraction of a byte not yet earned: move the clock only when bytes came in. */
	if (add) {
		r->tokens = r->tokens + add > r->cfg.burst ? r->cfg.burst : r->tokens + add;
		r->last_ns = now;
	}
}

/* The bucket is empty: come back when it holds a useful amount (one short buffer's worth). */
static void bucket_wait(struct virtio_rng *r)
{
	r->throttled++;
	if (r->timer_fd < 0 || r->armed)
		return;
	uint64_t want = r->cfg.burst < 64 ? r->cfg.burst : 64;
	uint64_t ns = (want * NSEC_PER_SEC + r->cfg.rate - 1) / r->cfg.rate;
	struct itimerspec its = {.it_value = {.tv_sec = (time_t)(ns / NSEC_PER_SEC),
					      .tv_nsec = (long)(ns % NSEC_PER_SEC)}};
	if (timerfd_settime(r->timer_fd, 0, &its, NULL) == 0)
		r->armed = true;
}

/* Writes random bytes into the chain's writable segments, at most the bucket's. Bytes written. */
static uint32_t rng_fill(struct virtio_rng *r, struct virtio_mmio *t, const struct virtq_chain *c)
{
	uint32_t done = 0;
	for (uint32_t i = c->nr_out; i < c->nr && r->tokens; i++) {
		const struct virtq_seg *s = &c->seg[i];
		uint64_t n = s->len < r->tokens ? s->len : r->tokens;
		uint8_t *p = guest_mem_ptr(t->mem, s->gpa, n);
		if (!p || !n)
			break;
		uint64_t got = 0;
		while (got < n) {
			ssize_t k = getrandom(p + got, n - got, 0);
			if (k < 0 && errno == EINTR)
				continue;
			if (k <= 0)
				break;
			got += (uint64_t)k;
		}
		virtio_mmio_mark_dirty(t, s->gpa, got);
		r->tokens -= got;
		done += (uint32_t)got;
		if (got < n)
			break;
	}
	r->served += done;
	return done;
}

/* Transport lock held: serve requests while the bucket has bytes, one ring's worth per turn. */
static void rng_queue_notify(void *dev, struct virtio_mmio *t, uint32_t qi)
{
	struct virtio_rng *r = dev;
	struct virtq *q = &t->queues[qi];
	bool pushed = false;
	for (int n = 0;; n++) {
		if (n == VIRTIO_NOTIFY_BUDGET) {
			virtio_mmio_defer(t, qi);
			break;
		}
		bucket_refill(r);
		if (!r->tokens) {
			bucket_wait(r);
			break;
		}
		int got = virtq_pop(q, &r->chain);
		if (got == 0)
			break;
		if (got == -EIO) {
			virtio_mmio_set_needs_reset(t);
			break;
		}
		/* A malformed chain gets nothing written; the driver sees a zero-length reply. */
		uint32_t len = got == 1 ? rng_fill(r, t, &r->chain) : 0;
		if (virtq_push(q, r->chain.head, len)) {
			virtio_mmio_set_needs_reset(t);
			break;
		}
		pushed = true;
	}
	if (pushed)
		virtio_mmio_notify_used(t, qi);
}

static void rng_reset(void *dev)
{
	(void)dev; /* the bucket is the host's limit, not negotiated state: it stays */
}

static const struct virtio_dev_ops rng_ops = {
    .name = "virtio-rng",
    .device_id = VIRTIO_ID_RNG,
    .features = VIRTIO_F_RING_INDIRECT_DESC | VIRTIO_F_RING_EVENT_IDX,
    .nr_queues = 1,
    .queue_notify = rng_queue_notify,
    .reset = rng_reset,
};

/* The bucket has refilled: kick the queue through its notify eventfd (served under the lock). */
static void on_timer(void *opaque, uint32_t events)
{
	(void)events;
	struct virtio_rng *r = opaque;
	uint64_t v;
	if (read(r->timer_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		log_warn(r->host->log, "virtio-rng: timer read: %s", strerror(errno));
	pthread_mutex_lock(&r->mmio.lock);
	r->armed = false;
	virtio_mmio_defer(&r->mmio, 0);
	pthread_mutex_unlock(&r->mmio.lock);
}

static void rng_destroy(void *dev)
{
	struct virtio_rng *r = dev;
	if (r->watched)
		evloop_del(r->host->loop, r->timer_fd);
	if (r->timer_fd >= 0)
		close(r->timer_fd);
	r->timer_fd = -1;
	r->watched = false;
	virtio_mmio_destroy(&r->mmio);
}

static int rng_create(void *dev, const struct device_host *h, const void *cfg)
{
	struct virtio_rng *r = dev;
	r->host = h->host;
	r->cfg = *(const struct rng_cfg *)cfg;
	r->tokens = r->cfg.burst;
	r->last_ns = mono_ns();
	r->timer_fd = -1;
	int e = virtio_mmio_create(&r->mmio, h->host, h->mmio_base, h->irq, &rng_ops, r);
	if (e)
		return e;
	r->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	e = r->timer_fd < 0 ? -errno : evloop_add(h->host->loop, r->timer_fd, EPOLLIN, on_timer, r);
	if (e) {
		log_err(h->host->log, "virtio-rng: cannot set up its timer: %s", strerror(-e));
		rng_destroy(r);
		return e;
	}
	r->watched = true;
	return 0;
}

static struct virtio_mmio *rng_mmio(void *dev)
{
	return &((struct virtio_rng *)dev)->mmio;
}

static void rng_save(void *dev, void *out)
{
	struct virtio_rng *r = dev;
	pthread_mutex_lock(&r->mmio.lock);
	struct virtio_rng_state st = {.version = RNG_STATE_VERSION,
				      .rate = r->cfg.rate,
				      .burst = r->cfg.burst,
				      .tokens = r->tokens,
				      .served = r->served};
	pthread_mutex_unlock(&r->mmio.lock);
	memcpy(out, &st, sizeof(st));
}

static int rng_restore(void *dev, const void *in, char *err, size_t errlen)
{
	struct virtio_rng *r = dev;
	struct virtio_rng_state st;
	memcpy(&st, in, sizeof(st));
	if (st.version != RNG_STATE_VERSION)
		return errmsg(err, errlen, -EINVAL, "virtio-rng: state version %u is not supported",
			      st.version);
	if (st.rate != r->cfg.rate || st.burst != r->cfg.burst || st.tokens > st.burst)
		return errmsg(err, errlen, -EINVAL,
			      "virtio-rng: saved bucket (%llu B/s, %llu B, %llu left) does not fit "
			      "this device",
			      (unsigned long long)st.rate, (unsigned long long)st.burst,
			      (unsigned long long)st.tokens);
	pthread_mutex_lock(&r->mmio.lock);
	r->tokens = st.tokens;
	r->served = st.served;
	r->last_ns = mono_ns(); /* the old process's clock means nothing here */
	pthread_mutex_unlock(&r->mmio.lock);
	return 0;
}

static int cfg_check(struct rng_cfg *c, char *err, size_t errlen)
{
	if (c->rate < 1 || c->rate > RNG_MAX_RATE || c->burst < 1 || c->burst > RNG_MAX_BURST)
		return errmsg(err, errlen, -EINVAL,
			      "rate must be 1..%llu bytes/s and burst 1..%llu bytes",
			      (unsigned long long)RNG_MAX_RATE, (unsigned long long)RNG_MAX_BURST);
	return 0;
}

/* "--rng" (1 MiB/s) or "--rng=BYTES_PER_SEC"; the bucket holds up to 64 KiB, or a second's worth.
 */
static int rng_opt_parse(const char *arg, void *cfg, char *err, size_t errlen)
{
	struct rng_cfg *c = cfg;
	c->rate = RNG_DEFAULT_RATE;
	if (arg) {
		char *end;
		errno = 0;
		unsigned long long v = strtoull(arg, &end, 10);
		if (errno || end == arg || *end || *arg == '-')
			return errmsg(err, errlen, -EINVAL,
				      "'%s' is not a number of bytes per second", arg);
		c->rate = v;
	}
	c->burst = c->rate < RNG_MAX_BURST ? c->rate : RNG_MAX_BURST;
	return cfg_check(c, err, errlen);
}

static json_t *rng_spec_to_json(const void *cfg)
{
	const struct rng_cfg *c = cfg;
	return json_pack("{s:I,s:I}", "rate", (json_int_t)c->rate, "burst", (json_int_t)c->burst);
}

static int rng_spec_from_json(json_t *j, void *cfg, char *err, size_t errlen)
{
	struct rng_cfg *c = cfg;
	json_t *rate = json_object_get(j, "rate"), *burst = json_object_get(j, "burst");
	if (!json_is_integer(rate) || !json_is_integer(burst) || json_integer_value(rate) < 0 ||
	    json_integer_value(burst) < 0)
		return errmsg(err, errlen, -EINVAL, "rate and burst must be numbers");
	c->rate = (uint64_t)json_integer_value(rate);
	c->burst = (uint64_t)json_integer_value(burst);
	return cfg_check(c, err, errlen);
}

const struct device_type virtio_rng_type = {
    .name = "virtio-rng",
    .opt_name = "rng",
    .opt_help =
	"  --rng[=BYTES/S]     add a virtio-rng entropy device (/dev/hwrng), at most BYTES/S\n"
	"                      (default 1048576; bursts up to 64K)\n",
    .opt_parse = rng_opt_parse,
    .spec_to_json = rng_spec_to_json,
    .spec_from_json = rng_spec_from_json,
    .size = sizeof(struct virtio_rng),
    .create = rng_create,
    .destroy = rng_destroy,
    .mmio = rng_mmio,
    .state_size = sizeof(struct virtio_rng_state),
    .save = rng_save,
    .restore = rng_restore,
};
