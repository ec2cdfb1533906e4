/* virtio-rng on a fake machine: requests filled from getrandom within the token bucket, pages
 * marked dirty, state saved and checked. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "devices/device.h"
#include "devices/virtio_mmio.h"
#include "host_fake.h"
#include "vmm/guest_mem.h"

#define QSIZE 16
#define DESC  0x1000ULL
#define AVAIL 0x2000ULL
#define USED  0x3000ULL
#define BUF   0x10000ULL

struct fix {
	struct guest_mem mem;
	struct host_fake hf;
	const struct device_type *t;
	void *dev;
	struct virtio_mmio *m;
	uint64_t dirty_lo, dirty_hi; /* span of data pages the device marked */
	uint16_t avail;
};

static void note_dirty(void *opaque, uint64_t gpa, uint64_t len)
{
	struct fix *f = opaque;
	if (gpa < BUF)
		return; /* the used ring */
	if (!f->dirty_hi || gpa < f->dirty_lo)
		f->dirty_lo = gpa;
	if (gpa + len > f->dirty_hi)
		f->dirty_hi = gpa + len;
}

static uint8_t *gp(struct fix *f, uint64_t gpa, uint64_t len)
{
	uint8_t *p = guest_mem_ptr(&f->mem, gpa, len);
	assert_non_null(p);
	return p;
}

/* A virtio-rng with bucket `rate` (from its own option parser) and queue 0 ready. */
static struct fix *fix_new(const char *rate)
{
	struct fix *f = calloc(1, sizeof(*f));
	assert_non_null(f);
	assert_int_equal(guest_mem_create(&f->mem, 4ULL << 20), 0);
	f->t = device_type_find("virtio-rng");
	assert_non_null(f->t);
	struct device_spec spec = {.type = f->t};
	char err[200];
	assert_int_equal(f->t->opt_parse(rate, spec.cfg, err, sizeof(err)), 0);
	f->dev = calloc(1, f->t->size);
	assert_int_equal(host_fake_init(&f->hf, &f->mem), 0);
	f->hf.on_dirty = note_dirty;
	f->hf.dirty_opaque = f;
	struct device_host h = {.host = &f->hf.host, .mmio_base = VIRTIO_MMIO_BASE, .irq = 5};
	assert_int_equal(f->t->create(f->dev, &h, spec.cfg), 0);
	f->m = f->t->mmio(f->dev);
	uint32_t id;
	virtio_mmio_read(f->m, 0x008, (uint8_t *)&id, 4);
	assert_int_equal(id, 4);
	virtio_fake_driver_ready(f->m, 1, QSIZE, DESC, AVAIL, USED, 0);
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

/* Offers descriptor `i` (one writable buffer of `len` at `gpa`) and kicks the queue. */
static void offer(struct fix *f, uint16_t i, uint64_t gpa, uint32_t len)
{
	uint8_t *d = gp(f, DESC + 16ULL * i, 16);
	uint16_t flags = 2 /* WRITE */, next = 0;
	memcpy(d, &gpa, 8);
	memcpy(d + 8, &len, 4);
	memcpy(d + 12, &flags, 2);
	memcpy(d + 14, &next, 2);
	memcpy(gp(f, AVAIL + 4 + 2ULL * (f->avail % QSIZE), 2), &i, 2);
	f->avail++;
	memcpy(gp(f, AVAIL + 2, 2), &f->avail, 2);
	virtio_fake_write(f->m, 0x050, 0);
}

static uint16_t used_idx(struct fix *f)
{
	uint16_t v;
	memcpy(&v, gp(f, USED + 2, 2), 2);
	return v;
}

static uint32_t used_len(struct fix *f, uint16_t n)
{
	uint32_t v;
	memcpy(&v, gp(f, USED + 4 + 8ULL * (n % QSIZE) + 4, 4), 4);
	return v;
}

static bool all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

static void test_fills_random_bytes(void **state)
{
	(void)state;
	struct fix *f = fix_new(NULL); /* 1 MiB/s, 64K burst */
	offer(f, 0, BUF, 512);
	assert_int_equal(used_idx(f), 1);
	assert_int_equal(used_len(f, 0), 512);
	assert_false(all_zero(gp(f, BUF, 512), 512));
	assert_int_equal(f->dirty_lo, BUF);
	assert_int_equal(f->dirty_hi, BUF + 512);
	/* A second buffer gets other bytes. */
	offer(f, 1, BUF + 4096, 512);
	assert_int_equal(used_idx(f), 2);
	assert_memory_not_equal(gp(f, BUF, 512), gp(f, BUF + 4096, 512), 512);
	fix_free(f);
}

static void test_bucket_limits(void **state)
{
	(void)state;
	struct fix *f = fix_new("64"); /* 64 bytes/s: bucket of 64 */
	offer(f, 0, BUF, 100);
	assert_int_equal(used_idx(f), 1);
	assert_int_equal(used_len(f, 0), 64); /* a short reply: what the bucket held */
	assert_true(all_zero(gp(f, BUF + 64, 36), 36));
	assert_int_equal(f->dirty_hi, BUF + 64);
	/* Empty bucket: the request waits on the ring instead of being answered empty. */
	offer(f, 1, BUF + 4096, 100);
	assert_int_equal(used_idx(f), 1);
	fix_free(f);
}

static void test_malformed_chain(void **state)
{
	(void)state;
	struct fix *f = fix_new(NULL);
	/* A buffer outside guest RAM: answered with nothing written, the device goes on. */
	offer(f, 0, 1ULL << 40, 64);
	assert_int_equal(used_idx(f), 1);
	assert_int_equal(used_len(f, 0), 0);
	assert_false(f->m->status & VIRTIO_STATUS_NEEDS_RESET);
	offer(f, 1, BUF, 16);
	assert_int_equal(used_len(f, 1), 16);
	fix_free(f);
}

static void test_save_restore(void **state)
{
	(void)state;
	struct fix *f = fix_new("1000");
	offer(f, 0, BUF, 600);
	assert_true(f->t->state_size > 0 && f->t->state_size <= DEVICE_STATE_MAX);
	_Alignas(8) uint8_t st[DEVICE_STATE_MAX], bad[DEVICE_STATE_MAX];
	f->t->save(f->dev, st);
	char err[256];
	struct fix *g = fix_new("1000");
	assert_int_equal(f->t->restore(g->dev, st, err, sizeof(err)), 0);
	/* The restored bucket holds what was left (about 400 bytes), not a full one. */
	offer(g, 0, BUF, 1000);
	assert_true(used_len(g, 0) < 600);
	/* Wrong version, a different rate, more tokens than the burst: refused with a reason. */
	memcpy(bad, st, sizeof(bad));
	bad[0] = 9;
	assert_int_equal(f->t->restore(g->dev, bad, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "version"));
	struct fix *h = fix_new("2000");
	assert_int_equal(f->t->restore(h->dev, st, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "does not fit"));
	fix_free(h);
	fix_free(g);
	fix_free(f);
}

static void test_options(void **state)
{
	(void)state;
	const struct device_type *t = device_type_find("virtio-rng");
	struct device_spec s;
	char err[200];
	assert_int_equal(t->opt_parse("0", s.cfg, err, sizeof(err)), -EINVAL);
	assert_int_equal(t->opt_parse("-5", s.cfg, err, sizeof(err)), -EINVAL);
	assert_int_equal(t->opt_parse("12x", s.cfg, err, sizeof(err)), -EINVAL);
	assert_int_equal(t->opt_parse("99999999999", s.cfg, err, sizeof(err)), -EINVAL);
	assert_int_equal(t->opt_parse("4096", s.cfg, err, sizeof(err)), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_fills_random_bytes),
	    cmocka_unit_test(test_bucket_limits),
	    cmocka_unit_test(test_malformed_chain),
	    cmocka_unit_test(test_save_restore),
	    cmocka_unit_test(test_options),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
