/* virtio-balloon (device id 5): free page reporting, inflate/deflate to a host-set target and
 * guest memory statistics; pages the guest gives up go back to the host (vm_host discard). */
#include "devices/virtio_balloon.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/byteorder.h"
#include "common/errmsg.h"
#include "devices/device.h"

#define BALLOON_STATE_VERSION 1
#define BALLOON_CONFIG_SIZE   16 /* num_pages, actual, free_page_hint_cmd_id, poison_val */
#define BALLOON_MAX_QUEUES    4	 /* inflate, deflate, stats, reporting */
#define PFN_CHUNK	      256
#define STAT_ENTRY	      10 /* le16 tag, le64 value, packed */

_Static_assert(sizeof(struct balloon_cfg) <= DEVICE_CFG_BYTES, "balloon config fits a device_spec");

enum balloon_queue { Q_INFLATE, Q_DEFLATE, Q_STATS, Q_REPORTING, Q_NONE };

struct virtio_balloon {
	struct virtio_mmio mmio;
	const struct vm_host *host;
	struct balloon_cfg cfg;
	struct virtio_dev_ops ops; /* features follow the config: the transport points here */
	uint32_t target_pages, actual_pages;
	uint64_t ram_pages;
	bool stats_held; /* the driver's stats buffer is with us until we want fresh numbers */
	uint16_t stats_head;
	struct balloon_info
	    n; /* counters and the last statistics (target/actual/features unused) */
	struct virtq_chain chain;
	uint32_t pfns[PFN_CHUNK];
};

/* Saved with snapshots: the target, the held stats buffer and the counters. */
struct virtio_balloon_state {
	uint32_t version, target_pages, actual_pages;
	uint16_t stats_held, stats_head;
	uint64_t reported_bytes, reported_ranges, inflated_pages, deflated_pages, invalid;
	uint32_t stats_valid, pad;
	uint64_t stats[BALLOON_NR_STATS];
};
_Static_assert(sizeof(struct virtio_balloon_state) <= DEVICE_STATE_MAX, "balloon state fits");

/*
 * Queue numbers are packed: the driver creates the stats queue only with STATS_VQ and the
 * reporting queue only with REPORTING (free page hints, which we do not offer, sit between).
 */
static enum balloon_queue queue_role(const struct virtio_mmio *t, uint32_t qi)
{
	if (qi == 0)
		return Q_INFLATE;
	if (qi == 1)
		return Q_DEFLATE;
	uint32_t next = 2;
	if (virtio_mmio_has_feature(t, 1ULL << VIRTIO_BALLOON_F_STATS_VQ) && qi == next++)
		return Q_STATS;
	if (virtio_mmio_has_feature(t, 1ULL << VIRTIO_BALLOON_F_REPORTING) && qi == next)
		return Q_REPORTING;
	return Q_NONE;
}

/* Gives [gpa, gpa+len) back; a range that is not page-aligned RAM only counts as invalid. */
static void give_back(struct virtio_balloon *b, uint64_t gpa, uint64_t len)
{
	int r = b->host->ops->discard(b->host->ctx, gpa, len);
	if (r == -EINVAL)
		b->n.invalid++;
	else if (r)
		b->n.discard_errors++;
}

/*
 * Inflate (give == true) or deflate: the readable part is an array of le32 page frame numbers
 * (4 KiB pages). Inflated pages go back to the host, runs of consecutive frames in one call;
 * deflated ones need nothing (they read as zeros when the guest touches them again).
 */
static void serve_pfns(struct virtio_balloon *b, const struct virtq *q, bool give)
{
	uint64_t total = b->chain.out_len / 4;
	if (total > BALLOON_MAX_PFNS) {
		b->n.invalid += total - BALLOON_MAX_PFNS;
		total = BALLOON_MAX_PFNS;
	}
	uint64_t run_start = 0, run_len = 0;
	for (uint64_t done = 0; done < total;) {
		uint64_t n = total - done < PFN_CHUNK ? total - done : PFN_CHUNK;
		uint64_t got = virtq_chain_read(q, &b->chain, done * 4, b->pfns, n * 4) / 4;
		if (!got)
			break;
		for (uint64_t i = 0; i < got; i++) {
			uint64_t gpa = (uint64_t)b->pfns[i] << 12;
			if (!give) {
				b->n.deflated_pages++;
				continue;
			}
			b->n.inflated_pages++;
			if (run_len && gpa == run_start + run_len) {
				run_len += 4096;
				continue;
			}
			if (run_len)
				give_back(b, run_start, run_len);
			run_start = gpa;
			run_len = 4096;
		}
		done += got;
	}
	if (run_len)
		give_back(b, run_start, run_len);
}

/*
 * Free page reporting: each segment is a range of free guest pages (Linux: 2-4 MiB blocks).
 * Only whole pages inside it go back. The chain returns to the driver only after every range
 * is given back and marked (the caller pushes it last): the driver reuses the pages only then.
 */
static void serve_report(struct virtio_balloon *b)
{
	for (uint32_t i = 0; i < b->chain.nr; i++) {
		const struct virtq_seg *s = &b->chain.seg[i];
		uint64_t start = (s->gpa + 4095) & ~4095ULL;
		uint64_t end = (s->gpa + s->len) & ~4095ULL;
		if (start < s->gpa || end <= start) { /* wrapped, empty or less than a page */
			b->n.invalid++;
			continue;
		}
		uint64_t before = b->n.invalid + b->n.discard_errors;
		give_back(b, start, end - start);
		if (b->n.invalid + b->n.discard_errors == before) {
			b->n.reported_bytes += end - start;
			b->n.reported_ranges++;
		}
	}
}

/* Statistics: tag/value pairs; the buffer stays with us until we want new numbers. */
static void serve_stats(struct virtio_balloon *b, const struct virtq *q)
{
	uint8_t e[STAT_ENTRY];
	for (uint64_t i = 0; i < BALLOON_MAX_STAT_ENTRIES; i++) {
		if (virtq_chain_read(q, &b->chain, i * STAT_ENTRY, e, STAT_ENTRY) != STAT_ENTRY)
			break;
		uint16_t tag = get_le16(e);
		uint64_t v = get_le64(e + 2);
		if (tag < BALLOON_NR_STATS) {
			b->n.stats[tag] = v;
			b->n.stats_valid |= 1u << tag;
		}
	}
	b->n.stats_updates++;
}

/* Transport lock held (event loop): one ring's worth of chains per turn. */
static void balloon_queue_notify(void *dev, struct virtio_mmio *t, uint32_t qi)
{
	struct virtio_balloon *b = dev;
	struct virtq *q = &t->queues[qi];
	enum balloon_queue role = queue_role(t, qi);
	bool pushed = false;
	for (int n = 0;; n++) {
		if (n == VIRTIO_NOTIFY_BUDGET) {
			virtio_mmio_defer(t, qi);
			break;
		}
		int got = virtq_pop(q, &b->chain);
		if (got == 0)
			break;
		if (got == -EIO) {
			virtio_mmio_set_needs_reset(t);
			break;
		}
		if (got == 1) {
			switch (role) {
			case Q_INFLATE:
			case Q_DEFLATE:
				serve_pfns(b, q, role == Q_INFLATE);
				break;
			case Q_REPORTING:
				serve_report(b);
				break;
			case Q_STATS:
				serve_stats(b, q);
				if (b->stats_held) /* a second buffer: give the older one back */
					pushed |= virtq_push(q, b->stats_head, 0) == 0;
				b->stats_held = true;
				b->stats_head = b->chain.head;
				continue;
			case Q_NONE:
				b->n.invalid++;
				break;
			}
		} else {
			b->n.invalid++;
		}
		if (virtq_push(q, b->chain.head, 0)) {
			virtio_mmio_set_needs_reset(t);
			break;
		}
		pushed = true;
	}
	if (pushed)
		virtio_mmio_notify_used(t, qi);
}

static void balloon_config_read(void *dev, uint32_t off, uint8_t *data, uint32_t len)
{
	struct virtio_balloon *b = dev;
	uint8_t cfg[BALLOON_CONFIG_SIZE] = {0};
	put_le32(cfg, b->target_pages);
	put_le32(cfg + 4, b->actual_pages);
	for (uint32_t i = 0; i < len; i++)
		data[i] = off < sizeof(cfg) && i < sizeof(cfg) - off ? cfg[off + i] : 0;
}

/* The driver writes only `actual` (bytes 4..7); anything else is ignored. */
static void balloon_config_write(void *dev, uint32_t off, const uint8_t *data, uint32_t len)
{
	struct virtio_balloon *b = dev;
	for (uint32_t i = 0; i < len; i++) {
		uint32_t at = off + i;
		if (at < off || at < 4 || at >= 8)
			continue;
		uint32_t shift = 8 * (at - 4);
		b->actual_pages = (b->actual_pages & ~(0xffu << shift)) | (uint32_t)data[i]
									      << shift;
	}
}

static void balloon_reset(void *dev)
{
	struct virtio_balloon *b = dev;
	b->stats_held = false; /* the host's target stays: it is the host's wish, not negotiated */
	b->actual_pages = 0;
}

static struct virtio_dev_ops balloon_ops_for(const struct balloon_cfg *c)
{
	uint64_t f = VIRTIO_F_RING_EVENT_IDX;
	if (c->stats)
		f |= 1ULL << VIRTIO_BALLOON_F_STATS_VQ;
	if (c->deflate_on_oom)
		f |= 1ULL << VIRTIO_BALLOON_F_DEFLATE_ON_OOM;
	if (c->reporting)
		f |= 1ULL << VIRTIO_BALLOON_F_REPORTING;
	return (struct virtio_dev_ops){
	    .name = "virtio-balloon",
	    .device_id = VIRTIO_ID_BALLOON,
	    .features = f,
	    .nr_queues = BALLOON_MAX_QUEUES,
	    .config_size = BALLOON_CONFIG_SIZE,
	    .config_read = balloon_config_read,
	    .config_write = balloon_config_write,
	    .queue_notify = balloon_queue_notify,
	    .reset = balloon_reset,
	};
}

void virtio_balloon_set_target(struct virtio_balloon *b, uint64_t pages)
{
	pthread_mutex_lock(&b->mmio.lock);
	if (pages > b->ram_pages)
		pages = b->ram_pages;
	if (pages > UINT32_MAX)
		pages = UINT32_MAX;
	if (b->target_pages != (uint32_t)pages) {
		b->target_pages = (uint32_t)pages;
		virtio_mmio_notify_config(&b->mmio);
	}
	pthread_mutex_unlock(&b->mmio.lock);
}

/*
 * Linux primes the stats queue with its first buffer before it sets DRIVER_OK, when the
 * transport does not pass kicks on yet: look at the queue whenever the host asks.
 */
static void stats_take_primed(struct virtio_balloon *b)
{
	if (!(b->mmio.status & VIRTIO_STATUS_DRIVER_OK) || b->stats_held)
		return;
	for (uint32_t qi = 2; qi < BALLOON_MAX_QUEUES; qi++)
		if (queue_role(&b->mmio, qi) == Q_STATS && b->mmio.queues[qi].ready)
			balloon_queue_notify(b, &b->mmio, qi);
}

void virtio_balloon_info(struct virtio_balloon *b, struct balloon_info *out)
{
	pthread_mutex_lock(&b->mmio.lock);
	stats_take_primed(b);
	*out = b->n;
	out->target_pages = b->target_pages;
	out->actual_pages = b->actual_pages;
	out->features = b->mmio.driver_features;
	out->deflate_on_oom =
	    virtio_mmio_has_feature(&b->mmio, 1ULL << VIRTIO_BALLOON_F_DEFLATE_ON_OOM);
	out->reporting = virtio_mmio_has_feature(&b->mmio, 1ULL << VIRTIO_BALLOON_F_REPORTING);
	out->stats_vq = virtio_mmio_has_feature(&b->mmio, 1ULL << VIRTIO_BALLOON_F_STATS_VQ);
	/* Hand the stats buffer back: the driver refills it with fresh numbers (next read). */
	if (b->stats_held && out->stats_vq) {
		for (uint32_t qi = 2; qi < BALLOON_MAX_QUEUES; qi++) {
			if (queue_role(&b->mmio, qi) != Q_STATS || !b->mmio.queues[qi].ready)
				continue;
			if (virtq_push(&b->mmio.queues[qi], b->stats_head, 0) == 0) {
				b->stats_held = false;
				virtio_mmio_notify_used(&b->mmio, qi);
			}
		}
	}
	pthread_mutex_unlock(&b->mmio.lock);
}

static void balloon_destroy(void *dev)
{
	virtio_mmio_destroy(&((struct virtio_balloon *)dev)->mmio);
}

static int balloon_create(void *dev, const struct device_host *h, const void *cfg)
{
	struct virtio_balloon *b = dev;
	b->host = h->host;
	b->cfg = *(const struct balloon_cfg *)cfg;
	b->ops = balloon_ops_for(&b->cfg);
	b->ram_pages = h->host->mem->size / 4096;
	uint64_t target = (uint64_t)b->cfg.target_mib * 256;
	b->target_pages = (uint32_t)(target < b->ram_pages ? target : b->ram_pages);
	return virtio_mmio_create(&b->mmio, h->host, h->mmio_base, h->irq, &b->ops, b);
}

static struct virtio_mmio *balloon_mmio(void *dev)
{
	return &((struct virtio_balloon *)dev)->mmio;
}

/*
 * Nothing in flight to finish: a chain is served whole on the event loop (given back, marked
 * dirty, then pushed) before the loop can run a snapshot, so saved queue indices and memory
 * agree: a report is either not yet taken (served again after restore) or done and marked.
 */
static void balloon_quiesce(void *dev)
{
	(void)dev;
}

static void balloon_save(void *dev, void *out)
{
	struct virtio_balloon *b = dev;
	pthread_mutex_lock(&b->mmio.lock);
	struct virtio_balloon_state st = {.version = BALLOON_STATE_VERSION,
					  .target_pages = b->target_pages,
					  .actual_pages = b->actual_pages,
					  .stats_held = b->stats_held,
					  .stats_head = b->stats_head,
					  .reported_bytes = b->n.reported_bytes,
					  .reported_ranges = b->n.reported_ranges,
					  .inflated_pages = b->n.inflated_pages,
					  .deflated_pages = b->n.deflated_pages,
					  .invalid = b->n.invalid,
					  .stats_valid = b->n.stats_valid};
	memcpy(st.stats, b->n.stats, sizeof(st.stats));
	pthread_mutex_unlock(&b->mmio.lock);
	memcpy(out, &st, sizeof(st));
}

static int balloon_restore(void *dev, const void *in, char *err, size_t errlen)
{
	struct virtio_balloon *b = dev;
	struct virtio_balloon_state st;
	memcpy(&st, in, sizeof(st));
	if (st.version != BALLOON_STATE_VERSION)
		return errmsg(err, errlen, -EINVAL,
			      "virtio-balloon: state version %u is not supported", st.version);
	if (st.target_pages > b->ram_pages || st.actual_pages > b->ram_pages || st.stats_held > 1 ||
	    st.stats_head >= VIRTQ_MAX_SIZE)
		return errmsg(err, errlen, -EINVAL,
			      "virtio-balloon: saved target %u, actual %u pages or stats buffer %u "
			      "do not fit this device (%llu pages of RAM)",
			      st.target_pages, st.actual_pages, st.stats_head,
			      (unsigned long long)b->ram_pages);
	pthread_mutex_lock(&b->mmio.lock);
	b->target_pages = st.target_pages;
	b->actual_pages = st.actual_pages;
	b->stats_held = st.stats_held;
	b->stats_head = st.stats_head;
	b->n.reported_bytes = st.reported_bytes;
	b->n.reported_ranges = st.reported_ranges;
	b->n.inflated_pages = st.inflated_pages;
	b->n.deflated_pages = st.deflated_pages;
	b->n.invalid = st.invalid;
	b->n.stats_valid = st.stats_valid;
	memcpy(b->n.stats, st.stats, sizeof(st.stats));
	pthread_mutex_unlock(&b->mmio.lock);
	return 0;
}

/* After a restore the saved stats head must fit the restored queue (checked once it is known). */
static void balloon_resumed(void *dev, struct logger *log)
{
	struct virtio_balloon *b = dev;
	pthread_mutex_lock(&b->mmio.lock);
	for (uint32_t qi = 2; qi < BALLOON_MAX_QUEUES && b->stats_held; qi++)
		if (queue_role(&b->mmio, qi) == Q_STATS &&
		    (!b->mmio.queues[qi].ready || b->stats_head >= b->mmio.queues[qi].size)) {
			log_warn(log, "virtio-balloon: saved stats buffer %u is not on its queue",
				 b->stats_head);
			b->stats_held = false;
		}
	pthread_mutex_unlock(&b->mmio.lock);
}

/* "--balloon" or "--balloon=WORDS": a number is the initial target in MiB; "nooom",
 * "noreport", "nostats" turn a feature off. */
static int balloon_opt_parse(const char *arg, void *cfg, char *err, size_t errlen)
{
	struct balloon_cfg *c = cfg;
	*c = (struct balloon_cfg){.deflate_on_oom = true, .reporting = true, .stats = true};
	char buf[128];
	if (!arg)
		return 0;
	if (snprintf(buf, sizeof(buf), "%s", arg) >= (int)sizeof(buf))
		return errmsg(err, errlen, -EINVAL, "balloon options are too long");
	char *save = NULL;
	for (char *w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
		if (!strcmp(w, "nooom")) {
			c->deflate_on_oom = false;
		} else if (!strcmp(w, "noreport")) {
			c->reporting = false;
		} else if (!strcmp(w, "nostats")) {
			c->stats = false;
		} else {
			char *end;
			errno = 0;
			unsigned long v = strtoul(w, &end, 10);
			if (errno || end == w || *end || *w == '-' || v > (1UL << 20))
				return errmsg(err, errlen, -EINVAL,
					      "'%s' is not a target in MiB (0..1048576) or one of "
					      "nooom, noreport, nostats",
					      w);
			c->target_mib = (uint32_t)v;
		}
	}
	return 0;
}

static json_t *balloon_spec_to_json(const void *cfg)
{
	const struct balloon_cfg *c = cfg;
	return json_pack("{s:I,s:b,s:b,s:b}", "target_mib", (json_int_t)c->target_mib,
			 "deflate_on_oom", c->deflate_on_oom, "reporting", c->reporting, "stats",
			 c->stats);
}

static int balloon_spec_from_json(json_t *j, void *cfg, char *err, size_t errlen)
{
	struct balloon_cfg *c = cfg;
	json_t *t = json_object_get(j, "target_mib"), *o = json_object_get(j, "deflate_on_oom"),
	       *r = json_object_get(j, "reporting"), *s = json_object_get(j, "stats");
	if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > (1 << 20) ||
	    !json_is_boolean(o) || !json_is_boolean(r) || !json_is_boolean(s))
		return errmsg(err, errlen, -EINVAL,
			      "balloon needs target_mib (0..1048576) and booleans deflate_on_oom, "
			      "reporting, stats");
	*c = (struct balloon_cfg){.target_mib = (uint32_t)json_integer_value(t),
				  .deflate_on_oom = json_is_true(o),
				  .reporting = json_is_true(r),
				  .stats = json_is_true(s)};
	return 0;
}

const struct device_type virtio_balloon_type = {
    .name = "virtio-balloon",
    .opt_name = "balloon",
    .opt_help =
	"  --balloon[=MIB][,nooom][,noreport][,nostats]\n"
	"                      add a virtio-balloon: free page reporting gives memory the guest\n"
	"                      frees back to the host; MIB is the initial inflate target (0)\n",
    .opt_parse = balloon_opt_parse,
    .spec_to_json = balloon_spec_to_json,
    .spec_from_json = balloon_spec_from_json,
    .size = sizeof(struct virtio_balloon),
    .create = balloon_create,
    .destroy = balloon_destroy,
    .mmio = balloon_mmio,
    .quiesce = balloon_quiesce,
    .state_size = sizeof(struct virtio_balloon_state),
    .save = balloon_save,
    .restore = balloon_restore,
    .resumed = balloon_resumed,
};
