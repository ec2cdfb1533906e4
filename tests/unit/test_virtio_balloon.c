/* virtio-balloon on a fake machine with a real memfd: free page reports and inflated pages are
 * punched out and marked, hostile descriptors and PFNs refused, stats held and handed back,
 * state saved and checked; guest_mem_discard on a private file mapping; dirty_log_discard. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "devices/device.h"
#include "devices/virtio_balloon.h"
#include "devices/virtio_mmio.h"
#include "host_fake.h"
#include "vmm/dirty_log.h"
#include "vmm/guest_mem.h"
#include "vmm/vm.h"

#define RAM	   (8ULL << 20)
#define QSIZE	   16
#define RING	   0x1000ULL /* queue q's rings at RING + q * 0x1000: desc, avail +0x400, used +0x800 */
#define DATA	   0x100000ULL
#define RING_BYTES 0x4000ULL /* the rings' pages, touched by the first offer */
#define F_ALL                                                                                      \
	((1u << VIRTIO_BALLOON_F_STATS_VQ) | (1u << VIRTIO_BALLOON_F_DEFLATE_ON_OOM) |             \
	 (1u << VIRTIO_BALLOON_F_REPORTING))
enum { QI_INFLATE, QI_DEFLATE, QI_STATS, QI_REPORT };

struct fix {
	struct guest_mem mem;
	struct host_fake hf;
	const struct device_type *t;
	void *dev;
	struct virtio_mmio *m;
	uint16_t avail[4], next_desc[4];
	uint64_t dirty_bytes; /* data pages marked (not the rings) */
};

static void note_dirty(void *opaque, uint64_t gpa, uint64_t len)
{
	struct fix *f = opaque;
	if (gpa >= DATA)
		f->dirty_bytes += len;
}

static uint8_t *gp(struct fix *f, uint64_t gpa, uint64_t len)
{
	uint8_t *p = guest_mem_ptr(&f->mem, gpa, len);
	assert_non_null(p);
	return p;
}

static uint64_t blocks(struct fix *f)
{
	struct stat st;
	assert_int_equal(fstat(f->mem.fd, &st), 0);
	return (uint64_t)st.st_blocks * 512;
}

/* A balloon configured by `opt` whose driver accepted `features` and set up its queues. */
static struct fix *fix_new(const char *opt, uint32_t features, uint32_t nq)
{
	struct fix *f = calloc(1, sizeof(*f));
	assert_non_null(f);
	assert_int_equal(guest_mem_create(&f->mem, RAM), 0);
	f->t = device_type_find("virtio-balloon");
	assert_non_null(f->t);
	struct device_spec spec = {.type = f->t};
	char err[200];
	assert_int_equal(f->t->opt_parse(opt, spec.cfg, err, sizeof(err)), 0);
	f->dev = calloc(1, f->t->size);
	assert_int_equal(host_fake_init(&f->hf, &f->mem), 0);
	f->hf.on_dirty = note_dirty;
	f->hf.dirty_opaque = f;
	struct device_host h = {.host = &f->hf.host, .mmio_base = VIRTIO_MMIO_BASE, .irq = 5};
	assert_int_equal(f->t->create(f->dev, &h, spec.cfg), 0);
	f->m = f->t->mmio(f->dev);
	uint32_t id;
	virtio_mmio_read(f->m, 0x008, (uint8_t *)&id, 4);
	assert_int_equal(id, VIRTIO_ID_BALLOON);
	const uint32_t ack_drv = VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER;
	virtio_fake_write(f->m, 0x070, ack_drv);
	virtio_fake_write(f->m, 0x024, 0);
	virtio_fake_write(f->m, 0x020, features);
	virtio_fake_write(f->m, 0x024, 1);
	virtio_fake_write(f->m, 0x020, 1); /* VERSION_1 */
	virtio_fake_write(f->m, 0x070, ack_drv | VIRTIO_STATUS_FEATURES_OK);
	for (uint32_t q = 0; q < nq; q++) {
		uint64_t base = RING + q * 0x1000ULL;
		virtio_fake_write(f->m, 0x030, q);
		virtio_fake_write(f->m, 0x038, QSIZE);
		virtio_fake_write(f->m, 0x080, (uint32_t)base);
		virtio_fake_write(f->m, 0x090, (uint32_t)(base + 0x400));
		virtio_fake_write(f->m, 0x0a0, (uint32_t)(base + 0x800));
		virtio_fake_write(f->m, 0x044, 1);
	}
	virtio_fake_write(f->m, 0x070,
			  ack_drv | VIRTIO_STATUS_FEATURES_OK | VIRTIO_STATUS_DRIVER_OK);
	assert_true(f->m->status & VIRTIO_STATUS_DRIVER_OK);
	return f;
}

static void fix_free(struct fix *f)
{
	f->t->destroy(f->dev);
	free(f->dev);
	host_fake_destroy(&f->hf);
	guest_mem_destroy(&f->mem);
	free(f);
}

struct seg {
	uint64_t gpa;
	uint32_t len;
};

/* Offers one chain of `n` segments on queue q (writable when `write`) and kicks it. */
static void offer(struct fix *f, uint32_t q, const struct seg *s, int n, bool write)
{
	uint64_t desc = RING + q * 0x1000ULL, avail = desc + 0x400;
	uint16_t head = f->next_desc[q];
	for (int i = 0; i < n; i++) {
		uint16_t idx = (uint16_t)((head + i) % QSIZE);
		uint16_t flags = (uint16_t)((write ? 2 : 0) | (i + 1 < n ? 1 : 0));
		uint16_t next = (uint16_t)((idx + 1) % QSIZE);
		uint8_t *d = gp(f, desc + 16ULL * idx, 16);
		memcpy(d, &s[i].gpa, 8);
		memcpy(d + 8, &s[i].len, 4);
		memcpy(d + 12, &flags, 2);
		memcpy(d + 14, &next, 2);
	}
	f->next_desc[q] = (uint16_t)((head + n) % QSIZE);
	memcpy(gp(f, avail + 4 + 2ULL * (f->avail[q] % QSIZE), 2), &head, 2);
	f->avail[q]++;
	memcpy(gp(f, avail + 2, 2), &f->avail[q], 2);
	virtio_fake_write(f->m, 0x050, q);
}

static uint16_t used_idx(struct fix *f, uint32_t q)
{
	uint16_t v;
	memcpy(&v, gp(f, RING + q * 0x1000ULL + 0x800 + 2, 2), 2);
	return v;
}

static bool all_bytes(const uint8_t *p, size_t n, uint8_t v)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != v)
			return false;
	return true;
}

static struct balloon_info info(struct fix *f)
{
	struct balloon_info bi;
	virtio_balloon_info(f->dev, &bi);
	return bi;
}

static void test_report_punches_and_marks(void **state)
{
	(void)state;
	struct fix *f = fix_new(NULL, F_ALL, 4);
	memset(gp(f, 2 << 20, 4 << 20), 0xab, 4 << 20);
	uint64_t before = blocks(f);
	assert_true(before >= (4ULL << 20));
	struct seg s[2] = {{2 << 20, 2 << 20}, {5 << 20, 1 << 20}};
	offer(f, QI_REPORT, s, 2, true);
	assert_int_equal(used_idx(f, QI_REPORT), 1);
	/* Given back: the memfd lost 3 MiB of blocks (the rings' pages came since), the ranges
	 * read zeros, the rest kept. */
	assert_true(blocks(f) + (3ULL << 20) <= before + RING_BYTES);
	assert_true(all_bytes(gp(f, 2 << 20, 2 << 20), 2 << 20, 0));
	assert_true(all_bytes(gp(f, 4 << 20, 1 << 20), 1 << 20, 0xab));
	assert_true(all_bytes(gp(f, 5 << 20, 1 << 20), 1 << 20, 0));
	assert_int_equal(f->dirty_bytes, 3 << 20);
	struct balloon_info bi = info(f);
	assert_int_equal(bi.reported_bytes, 3 << 20);
	assert_int_equal(bi.reported_ranges, 2);
	assert_int_equal(bi.invalid, 0);
	assert_true(bi.reporting && bi.stats_vq && bi.deflate_on_oom);
	assert_true(f->m->interrupt_status & VIRTIO_INT_USED);
	fix_free(f);
}

static void test_hostile_reports(void **state)
{
	(void)state;
	struct fix *f = fix_new(NULL, F_ALL, 4);
	memset(gp(f, DATA, RAM - DATA), 0x5a, RAM - DATA);
	/* Chains the virtqueue refuses whole (a segment outside RAM): each answered, none served.
	 */
	const struct seg whole[] = {
	    {1ULL << 40, 1 << 20},	 /* not RAM */
	    {RAM - 4096, 8192},		 /* runs past the end of RAM */
	    {0, 0xffffffffu},		 /* all of RAM and more */
	    {UINT64_MAX - 4095, 0x2000}, /* wraps */
	};
	for (int i = 0; i < 4; i++)
		offer(f, QI_REPORT, &whole[i], 1, true);
	assert_int_equal(used_idx(f, QI_REPORT), 4);
	/* In RAM but no whole page, or empty: refused; an unaligned range gives its inner page. */
	const struct seg odd[] = {{DATA + 1, 100}, {DATA + 0x800, 0x2000}};
	offer(f, QI_REPORT, odd, 2, true);
	const struct seg empty = {DATA, 0};
	offer(f, QI_REPORT, &empty, 1, true);
	assert_int_equal(used_idx(f, QI_REPORT), 6);
	assert_false(f->m->status & VIRTIO_STATUS_NEEDS_RESET);
	struct balloon_info bi = info(f);
	assert_int_equal(bi.invalid, 6);
	assert_int_equal(bi.reported_bytes, 4096);
	assert_int_equal(bi.discard_errors, 0);
	assert_true(all_bytes(gp(f, DATA, 0x1000), 0x1000, 0x5a));
	assert_true(all_bytes(gp(f, DATA + 0x1000, 0x1000), 0x1000, 0));
	assert_true(
	    all_bytes(gp(f, DATA + 0x2000, RAM - DATA - 0x2000), RAM - DATA - 0x2000, 0x5a));
	/* A read-only report is served the same way; the device keeps going. */
	struct seg ok = {DATA + 0x10000, 0x1000};
	offer(f, QI_REPORT, &ok, 1, false);
	assert_int_equal(used_idx(f, QI_REPORT), 7);
	assert_int_equal(info(f).reported_bytes, 8192);
	/* A host that cannot punch: counted as an error, the chain still comes back. */
	f->hf.discard_err = -EIO;
	struct seg more = {DATA + 0x20000, 0x1000};
	offer(f, QI_REPORT, &more, 1, true);
	assert_int_equal(used_idx(f, QI_REPORT), 8);
	assert_int_equal(info(f).discard_errors, 1);
	assert_int_equal(info(f).reported_bytes, 8192);
	fix_free(f);
}

static void put_pfns(struct fix *f, uint64_t gpa, const uint32_t *pfns, size_t n)
{
	memcpy(gp(f, gpa, n * 4), pfns, n * 4);
}

static void test_inflate_deflate(void **state)
{
	(void)state;
	struct fix *f = fix_new("4", F_ALL, 4);
	memset(gp(f, 0x200000, 0x400000), 0x77, 0x400000);
	uint64_t before = blocks(f);
	/* Three consecutive frames (one call), one alone, one outside RAM. */
	uint32_t pfns[] = {0x200, 0x201, 0x202, 0x400, 0xffffffffu};
	put_pfns(f, DATA, pfns, 5);
	struct seg s = {DATA, sizeof(pfns)};
	offer(f, QI_INFLATE, &s, 1, false);
	assert_int_equal(used_idx(f, QI_INFLATE), 1);
	assert_int_equal(f->hf.discards, 2);
	assert_int_equal(f->hf.discarded_bytes, 4 * 4096);
	assert_true(blocks(f) + 4 * 4096 <= before + RING_BYTES + 4096);
	assert_true(all_bytes(gp(f, 0x200000, 3 * 4096), 3 * 4096, 0));
	assert_true(all_bytes(gp(f, 0x203000, 4096), 4096, 0x77));
	assert_true(all_bytes(gp(f, 0x400000, 4096), 4096, 0));
	struct balloon_info bi = info(f);
	assert_int_equal(bi.inflated_pages, 5);
	assert_int_equal(bi.invalid, 1);
	assert_int_equal(bi.target_pages, 4 * 256);
	/* Deflate: counted, nothing given back. */
	offer(f, QI_DEFLATE, &s, 1, false);
	assert_int_equal(used_idx(f, QI_DEFLATE), 1);
	assert_int_equal(info(f).deflated_pages, 5);
	assert_int_equal(f->hf.discards, 2);
	/* A PFN array bigger than any driver sends: read only BALLOON_MAX_PFNS, rest refused. */
	struct seg huge = {DATA, (BALLOON_MAX_PFNS + 100) * 4};
	memset(gp(f, DATA, huge.len), 0, huge.len); /* all PFN 0 */
	offer(f, QI_INFLATE, &huge, 1, false);
	bi = info(f);
	assert_int_equal(bi.inflated_pages, 5 + BALLOON_MAX_PFNS);
	assert_int_equal(bi.invalid, 1 + 100);
	/* A PFN array outside RAM: nothing read, the chain still comes back. */
	struct seg bad = {RAM + 4096, 64};
	offer(f, QI_INFLATE, &bad, 1, false);
	assert_int_equal(used_idx(f, QI_INFLATE), 3);
	assert_false(f->m->status & VIRTIO_STATUS_NEEDS_RESET);
	fix_free(f);
}

static void put_stat(uint8_t *p, uint16_t tag, uint64_t v)
{
	p[0] = (uint8_t)tag;
	p[1] = (uint8_t)(tag >> 8);
	for (int i = 0; i < 8; i++)
		p[2 + i] = (uint8_t)(v >> (8 * i));
}

/* Linux offers its first stats buffer before DRIVER_OK: the kick is lost, the buffer is not. */
static void test_stats_primed_before_driver_ok(void **state)
{
	(void)state;
	struct fix *f = fix_new(NULL, F_ALL, 4);
	uint8_t *p = gp(f, DATA, 10);
	put_stat(p, BALLOON_STAT_AVAIL, 31337);
	struct seg s = {DATA, 10};
	uint32_t status = f->m->status;
	f->m->status &= ~VIRTIO_STATUS_DRIVER_OK; /* as during the driver's probe */
	offer(f, QI_STATS, &s, 1, false);
	f->m->status = status;
	assert_int_equal(f->m->queues[QI_STATS].last_avail, 0); /* the kick did nothing */
	struct balloon_info bi = info(f);
	assert_int_equal(bi.stats_updates, 1);
	assert_int_equal(bi.stats[BALLOON_STAT_AVAIL], 31337);
	assert_int_equal(used_idx(f, QI_STATS), 1); /* and handed back for fresh numbers */
	fix_free(f);
}

static void test_stats(void **state)
{
	(void)state;
	struct fix *f = fix_new(NULL, F_ALL, 4);
	uint8_t *p = gp(f, DATA, 30);
	put_stat(p, BALLOON_STAT_MEMFREE, 123456789);
	put_stat(p + 10, BALLOON_STAT_MEMTOT, 1ULL << 33);
	put_stat(p + 20, 999, 5); /* unknown tag: ignored */
	struct seg s = {DATA, 30};
	offer(f, QI_STATS, &s, 1, false);
	/* Held, not returned: the driver gets it back when the host wants fresh numbers. */
	assert_int_equal(used_idx(f, QI_STATS), 0);
	struct balloon_info bi = info(f); /* reads, and hands the buffer back */
	assert_int_equal(bi.stats_updates, 1);
	assert_int_equal(bi.stats[BALLOON_STAT_MEMFREE], 123456789);
	assert_int_equal(bi.stats[BALLOON_STAT_MEMTOT], 1ULL << 33);
	assert_int_equal(bi.stats_valid,
			 (1u << BALLOON_STAT_MEMFREE) | (1u << BALLOON_STAT_MEMTOT));
	assert_int_equal(used_idx(f, QI_STATS), 1);
	/* Nothing held now: another read does not push anything. */
	info(f);
	assert_int_equal(used_idx(f, QI_STATS), 1);
	/* A truncated entry is not read. */
	put_stat(p, BALLOON_STAT_MEMFREE, 1);
	struct seg shortseg = {DATA, 15};
	offer(f, QI_STATS, &shortseg, 1, false);
	assert_int_equal(info(f).stats[BALLOON_STAT_MEMFREE], 1);
	fix_free(f);
}

/* Without STATS_VQ the driver's reporting queue is number 2. */
static void test_queue_numbers_follow_features(void **state)
{
	(void)state;
	struct fix *f = fix_new(NULL, 1u << VIRTIO_BALLOON_F_REPORTING, 3);
	memset(gp(f, DATA, 4096), 1, 4096);
	struct seg s = {DATA, 4096};
	offer(f, 2, &s, 1, true);
	assert_int_equal(info(f).reported_bytes, 4096);
	assert_false(info(f).stats_vq);
	fix_free(f);
}

static uint32_t cfg32(struct fix *f, uint32_t off)
{
	uint32_t v;
	virtio_mmio_read(f->m, 0x100 + off, (uint8_t *)&v, 4);
	return v;
}

static void test_target_and_config(void **state)
{
	(void)state;
	struct fix *f = fix_new(NULL, F_ALL, 4);
	assert_int_equal(cfg32(f, 0), 0);
	uint32_t isr_before;
	virtio_balloon_set_target(f->dev, 100);
	assert_int_equal(cfg32(f, 0), 100);
	virtio_mmio_read(f->m, 0x060, (uint8_t *)&isr_before, 4);
	assert_true(isr_before & VIRTIO_INT_CONFIG);
	virtio_balloon_set_target(f->dev, UINT64_MAX); /* capped to RAM */
	assert_int_equal(cfg32(f, 0), RAM / 4096);
	/* The driver writes `actual`; writes elsewhere (num_pages) are ignored. */
	uint32_t v = 42;
	virtio_mmio_write(f->m, 0x104, (uint8_t *)&v, 4);
	virtio_mmio_write(f->m, 0x100, (uint8_t *)&v, 4);
	assert_int_equal(cfg32(f, 4), 42);
	assert_int_equal(cfg32(f, 0), RAM / 4096);
	assert_int_equal(info(f).actual_pages, 42);
	/* Reads past the config space are zeros. */
	assert_int_equal(cfg32(f, 16), 0);
	assert_int_equal(cfg32(f, 0xe00), 0);
	fix_free(f);
}

static void test_save_restore(void **state)
{
	(void)state;
	struct fix *f = fix_new(NULL, F_ALL, 4);
	virtio_balloon_set_target(f->dev, 300);
	memset(gp(f, DATA, 4096), 1, 4096);
	struct seg s = {DATA, 4096};
	offer(f, QI_REPORT, &s, 1, true);
	uint8_t *p = gp(f, DATA + 4096, 10);
	put_stat(p, BALLOON_STAT_AVAIL, 77);
	struct seg st_seg = {DATA + 4096, 10};
	offer(f, QI_STATS, &st_seg, 1, false);
	assert_true(f->t->state_size > 0 && f->t->state_size <= DEVICE_STATE_MAX);
	_Alignas(8) uint8_t st[DEVICE_STATE_MAX], bad[DEVICE_STATE_MAX];
	f->t->save(f->dev, st);
	char err[256];
	struct fix *g = fix_new(NULL, F_ALL, 4);
	assert_int_equal(g->t->restore(g->dev, st, err, sizeof(err)), 0);
	struct balloon_info bi = info(g); /* also hands the restored stats buffer back */
	assert_int_equal(bi.target_pages, 300);
	assert_int_equal(bi.reported_bytes, 4096);
	assert_int_equal(bi.stats[BALLOON_STAT_AVAIL], 77);
	assert_int_equal(used_idx(g, QI_STATS), 1);
	memcpy(bad, st, sizeof(bad));
	bad[0] = 9;
	assert_int_equal(g->t->restore(g->dev, bad, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "version"));
	memcpy(bad, st, sizeof(bad));
	uint32_t huge = UINT32_MAX;
	memcpy(bad + 4, &huge, 4); /* target beyond RAM */
	assert_int_equal(g->t->restore(g->dev, bad, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "do not fit"));
	fix_free(g);
	fix_free(f);
}

static void test_options(void **state)
{
	(void)state;
	const struct device_type *t = device_type_find("virtio-balloon");
	assert_non_null(t);
	struct balloon_cfg c;
	char err[256];
	assert_int_equal(t->opt_parse(NULL, &c, err, sizeof(err)), 0);
	assert_true(c.reporting && c.stats && c.deflate_on_oom && c.target_mib == 0);
	assert_int_equal(t->opt_parse("64,nooom,noreport", &c, err, sizeof(err)), 0);
	assert_true(!c.reporting && c.stats && !c.deflate_on_oom && c.target_mib == 64);
	assert_int_equal(t->opt_parse("-1", &c, err, sizeof(err)), -EINVAL);
	assert_int_equal(t->opt_parse("lots", &c, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "lots"));
	json_t *j = t->spec_to_json(&(struct balloon_cfg){5, true, false, true});
	struct balloon_cfg back;
	assert_int_equal(t->spec_from_json(j, &back, err, sizeof(err)), 0);
	assert_true(back.target_mib == 5 && back.deflate_on_oom && !back.reporting && back.stats);
	json_object_set_new(j, "reporting", json_string("yes"));
	assert_int_equal(t->spec_from_json(j, &back, err, sizeof(err)), -EINVAL);
	json_decref(j);
	/* Features offered follow the options. */
	struct fix *f = fix_new("nostats,noreport", 1u << VIRTIO_BALLOON_F_DEFLATE_ON_OOM, 2);
	assert_false(info(f).stats_vq);
	assert_false(info(f).reporting);
	assert_true(info(f).deflate_on_oom);
	fix_free(f);
}

/* A restored sandbox's RAM: a private mapping of a file. Discarded pages read zeros, not the
 * file's bytes, and the file is untouched. */
static void test_discard_private_mapping(void **state)
{
	(void)state;
	char path[] = "/tmp/cove-balloon-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	unlink(path);
	uint8_t page[4096];
	memset(page, 0xcd, sizeof(page));
	for (uint64_t off = 0; off < (4ULL << 20); off += 4096)
		assert_int_equal(pwrite(fd, page, 4096, (off_t)off), 4096);
	struct guest_mem m;
	assert_int_equal(guest_mem_create_from(&m, 4ULL << 20, fd, 0), 0);
	assert_true(m.private_file);
	uint8_t *p = guest_mem_ptr(&m, 0x100000, 0x3000);
	p[0] = 1; /* a private copy of the first page */
	assert_int_equal(guest_mem_discard(&m, 0x100000, 0x2000), 0);
	assert_true(all_bytes(p, 0x2000, 0));
	assert_true(all_bytes(p + 0x2000, 0x1000, 0xcd));
	assert_true(all_bytes(guest_mem_ptr(&m, 0xff000, 0x1000), 0x1000, 0xcd));
	uint8_t back[4096];
	assert_int_equal(pread(fd, back, 4096, 0x100000), 4096);
	assert_true(all_bytes(back, 4096, 0xcd));
	/* Written again after the discard: an ordinary private page. */
	p[5] = 9;
	assert_int_equal(p[5], 9);
	/* Hostile ranges. */
	assert_int_equal(guest_mem_discard(&m, 0x100001, 0x1000), -EINVAL);
	assert_int_equal(guest_mem_discard(&m, 0x100000, 0x800), -EINVAL);
	assert_int_equal(guest_mem_discard(&m, 0x100000, 0), -EINVAL);
	assert_int_equal(guest_mem_discard(&m, 4ULL << 20, 0x1000), -EINVAL);
	assert_int_equal(guest_mem_discard(&m, (4ULL << 20) - 0x1000, 0x2000), -EINVAL);
	assert_int_equal(guest_mem_discard(&m, UINT64_MAX & ~0xfffULL, 0x1000), -EINVAL);
	guest_mem_destroy(&m);
	close(fd);
}

/* dirty_log_discard: the memfd is punched and the pages marked dirty and discarded together;
 * taking the discarded set clears it. */
static void test_dirty_log_discard(void **state)
{
	(void)state;
	struct vm *vm = calloc(1, sizeof(*vm));
	assert_non_null(vm);
	assert_int_equal(guest_mem_create(&vm->mem, RAM), 0);
	size_t words = dirty_log_bitmap_words(vm);
	vm->vmm_dirty = calloc(words, 8);
	vm->discarded = calloc(words, 8);
	pthread_mutex_init(&vm->dirty_lock, NULL);
	memset(vm->mem.host, 0x11, RAM);
	struct stat st;
	assert_int_equal(fstat(vm->mem.fd, &st), 0);
	uint64_t before = (uint64_t)st.st_blocks * 512;
	assert_int_equal(dirty_log_discard(vm, 0x40000, 0x10000), 0); /* pages 64..79 */
	assert_int_equal(fstat(vm->mem.fd, &st), 0);
	assert_true(before - (uint64_t)st.st_blocks * 512 >= 0x10000);
	assert_int_equal(vm->vmm_dirty[1], 0xffffULL);
	assert_int_equal(vm->discarded[1], 0xffffULL);
	assert_int_equal(vm->vmm_dirty[0], 0);
	assert_true(all_bytes(vm->mem.host + 0x40000, 0x10000, 0));
	/* A bad range marks nothing. */
	assert_int_equal(dirty_log_discard(vm, RAM - 0x1000, 0x2000), -EINVAL);
	assert_int_equal(vm->vmm_dirty[words - 1], 0);
	uint64_t *out = calloc(words, 8);
	/* A peek leaves the set; a committed layer's pages clear only their own marks. */
	dirty_log_peek_discarded(vm, out);
	assert_int_equal(out[1], 0xffffULL);
	assert_int_equal(vm->discarded[1], 0xffffULL);
	memset(out, 0, words * 8);
	out[1] = 0xff;
	dirty_log_clear_discarded(vm, out);
	assert_int_equal(vm->discarded[1], 0xff00ULL);
	free(out);
	pthread_mutex_destroy(&vm->dirty_lock);
	free(vm->vmm_dirty);
	free(vm->discarded);
	guest_mem_destroy(&vm->mem);
	free(vm);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_report_punches_and_marks),
	    cmocka_unit_test(test_hostile_reports),
	    cmocka_unit_test(test_inflate_deflate),
	    cmocka_unit_test(test_stats),
	    cmocka_unit_test(test_stats_primed_before_driver_ok),
	    cmocka_unit_test(test_queue_numbers_follow_features),
	    cmocka_unit_test(test_target_and_config),
	    cmocka_unit_test(test_save_restore),
	    cmocka_unit_test(test_options),
	    cmocka_unit_test(test_discard_private_mapping),
	    cmocka_unit_test(test_dirty_log_discard),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
