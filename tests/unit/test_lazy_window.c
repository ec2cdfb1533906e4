/* Unit tests of snapshot/lazy_window.c: the run a fault fills (window bounds at RAM ends, holes,
 * filled pages, newer layers) and opening a run of sealed pages (batched, each page checked). */
#include <fcntl.h>

#include "helpers.h"

#include "chain_fixture.h"
#include "snapshot/lazy_window.h"

/* A layer set in memory only (no files): what lazy_window_pick looks at. */
struct fake_set {
	struct layer_set ls;
	uint64_t nr_pages;
};

static void fake_layer(struct fake_set *s, int k)
{
	struct mem_layer *l = &s->ls.layers[k];
	size_t words = (size_t)((s->nr_pages + 63) / 64);
	l->fd = -1;
	l->info.nr_pages = s->nr_pages;
	l->info.bitmap_len = words * 8;
	l->bitmap = calloc(words * 2, 8);
	assert_non_null(l->bitmap);
	l->stored = l->bitmap + words;
	if (k >= s->ls.nr)
		s->ls.nr = k + 1;
}

/* Layer k holds pages [a, b); stored (data) or a held zero page. */
static void hold(struct fake_set *s, int k, uint64_t a, uint64_t b, bool stored)
{
	struct mem_layer *l = &s->ls.layers[k];
	for (uint64_t p = a; p < b; p++) {
		l->bitmap[p / 64] |= 1ULL << (p % 64);
		if (stored)
			l->stored[p / 64] |= 1ULL << (p % 64);
	}
}

static void fake_free(struct fake_set *s)
{
	for (int k = 0; k < s->ls.nr; k++)
		free(s->ls.layers[k].bitmap);
}

static void pick(const uint64_t *filled, struct fake_set *s, uint64_t p, struct lazy_ra *ra,
		 uint64_t want_first, uint64_t want_count)
{
	uint64_t first = ~0ULL, count = ~0ULL;
	lazy_window_pick(filled, s->nr_pages, &s->ls, p, ra, &first, &count);
	if (first != want_first || count != want_count)
		fail_msg("fault at %llu: run [%llu, +%llu), expected [%llu, +%llu)",
			 (unsigned long long)p, (unsigned long long)first,
			 (unsigned long long)count, (unsigned long long)want_first,
			 (unsigned long long)want_count);
}

/* A random fault fills its aligned block; faults that follow the run double it, up to the max. */
static void test_window_grows_when_sequential(void **state)
{
	(void)state;
	struct fake_set s = {.nr_pages = 4096};
	fake_layer(&s, 0);
	hold(&s, 0, 0, 4096, true);
	uint64_t filled[64] = {0};
	struct lazy_ra ra = {0};
	pick(filled, &s, 37, &ra, 32, LAZY_WIN_MIN);
	pick(filled, &s, 48, &ra, 48, 2 * LAZY_WIN_MIN);
	pick(filled, &s, 80, &ra, 80, 4 * LAZY_WIN_MIN);
	uint64_t p = 144;
	for (int i = 0; i < 8; i++) { /* up to LAZY_WIN_MAX, never past it */
		uint64_t first, count;
		lazy_window_pick(filled, s.nr_pages, &s.ls, p, &ra, &first, &count);
		assert_int_equal(first, p);
		assert_true(count <= LAZY_WIN_MAX);
		p += count;
	}
	assert_int_equal(ra.win, LAZY_WIN_MAX);
	/* A smaller cap: windows never grow past it; 1 is page by page. */
	ra = (struct lazy_ra){.max = 64};
	pick(filled, &s, 100, &ra, 96, LAZY_WIN_MIN);
	for (uint64_t q = 112, w = 32; q<400; q += w, w = w * 2> 64 ? 64 : w * 2)
		pick(filled, &s, q, &ra, q, w);
	ra = (struct lazy_ra){.max = 1};
	pick(filled, &s, 77, &ra, 77, 1);
	pick(filled, &s, 78, &ra, 78, 1);
	ra = (struct lazy_ra){0};
	/* A jump elsewhere starts small again. */
	pick(filled, &s, 3000, &ra, 3000 - 3000 % LAZY_WIN_MIN, LAZY_WIN_MIN);
	fake_free(&s);
}

/* The window never runs past RAM's last page, nor below page 0, even with a huge window. */
static void test_window_ram_ends(void **state)
{
	(void)state;
	struct fake_set s = {.nr_pages = 1000}; /* not a multiple of the window */
	fake_layer(&s, 0);
	hold(&s, 0, 0, 1000, true);
	uint64_t filled[16] = {0};
	struct lazy_ra ra = {0};
	pick(filled, &s, 995, &ra, 992, 8);
	pick(filled, &s, 0, &ra, 0, LAZY_WIN_MIN);
	ra = (struct lazy_ra){.next = 990, .win = LAZY_WIN_MAX};
	pick(filled, &s, 990, &ra, 990, 10);
	struct fake_set t = {.nr_pages = 5}; /* RAM smaller than the smallest window */
	fake_layer(&t, 0);
	hold(&t, 0, 0, 5, true);
	ra = (struct lazy_ra){0};
	pick(filled, &t, 4, &ra, 0, 5);
	fake_free(&s);
	fake_free(&t);
}

/* Zero pages (held without data, or in no layer) and pages already filled end a run. */
static void test_window_stops_at_holes_and_filled(void **state)
{
	(void)state;
	struct fake_set s = {.nr_pages = 256};
	fake_layer(&s, 0);
	fake_layer(&s, 1);
	hold(&s, 0, 0, 10, true);
	hold(&s, 0, 12, 40, true);  /* 10, 11: in no layer */
	hold(&s, 1, 20, 22, false); /* the newer layer says 20, 21 are zero now */
	hold(&s, 1, 22, 24, true);
	uint64_t filled[4] = {0};
	struct lazy_ra ra = {0};
	pick(filled, &s, 5, &ra, 0, 10);
	ra = (struct lazy_ra){0};
	pick(filled, &s, 10, &ra, 10, 1); /* the fault's own page always, even a zero one */
	ra = (struct lazy_ra){0};
	pick(filled, &s, 17, &ra, 16, 4); /* [16, 20): 20 is a newer zero page */
	ra = (struct lazy_ra){0};
	pick(filled, &s, 23, &ra, 22, 10); /* 22, 23 from layer 1, then the base to 32 */
	filled[0] |= 1ULL << 28;
	ra = (struct lazy_ra){0};
	pick(filled, &s, 30, &ra, 29, 3); /* 28 already filled */
	filled[0] |= 1ULL << 30;
	ra = (struct lazy_ra){0};
	pick(filled, &s, 30, &ra, 29, 3); /* a filled page faulting again is still served */
	filled[0] |= 1ULL << 29 | 1ULL << 31;
	ra = (struct lazy_ra){0};
	pick(filled, &s, 30, &ra, 30, 1);
	ra = (struct lazy_ra){0};
	pick(filled, &s, 200, &ra, 200, 1);
	fake_free(&s);
}

static void next_run(const uint64_t *filled, struct fake_set *s, uint64_t from, uint64_t max,
		     bool want, uint64_t want_first, uint64_t want_count)
{
	uint64_t first = ~0ULL, count = ~0ULL;
	bool got = lazy_next_run(filled, s->nr_pages, &s->ls, from, max, &first, &count);
	assert_int_equal(got, want);
	if (want && (first != want_first || count != want_count))
		fail_msg("from %llu: run [%llu, +%llu), expected [%llu, +%llu)",
			 (unsigned long long)from, (unsigned long long)first,
			 (unsigned long long)count, (unsigned long long)want_first,
			 (unsigned long long)want_count);
}

/* Prefetch runs: only unfilled pages with data, capped, skipping empty words, up to RAM's end. */
static void test_next_run(void **state)
{
	(void)state;
	struct fake_set s = {.nr_pages = 1000};
	fake_layer(&s, 0);
	fake_layer(&s, 1);
	hold(&s, 0, 5, 9, true);
	hold(&s, 0, 300, 700, true);
	hold(&s, 1, 310, 320, false); /* newer zero pages split the base's run */
	hold(&s, 1, 990, 1000, true);
	uint64_t filled[16] = {0};
	next_run(filled, &s, 0, 64, true, 5, 4);
	next_run(filled, &s, 9, 64, true, 300, 10);
	next_run(filled, &s, 310, 64, true, 320, 64);
	next_run(filled, &s, 384, 1000, true, 384, 316);
	filled[6] = ~0ULL; /* pages 384..447 filled */
	next_run(filled, &s, 384, 1000, true, 448, 252);
	next_run(filled, &s, 700, 64, true, 990, 10);
	next_run(filled, &s, 995, 2, true, 995, 2);
	next_run(filled, &s, 1000, 64, false, 0, 0);
	next_run(filled, &s, 0, 0, false, 0, 0);
	filled[0] = 0x1e0; /* 5..8 filled */
	next_run(filled, &s, 0, 64, true, 300, 10);
	/* No bitmap (the decrypt-ahead helper's walk): every stored run, 384..447 included. */
	next_run(NULL, &s, 0, 64, true, 5, 4);
	next_run(NULL, &s, 384, 1000, true, 384, 316);
	next_run(NULL, &s, 1000, 64, false, 0, 0);
	fake_free(&s);
}

/* The sealed fixture chain, opened for restore with every layer checked (subkeys registered). */
struct run_fx {
	char dir[64];
	struct chain c;
	struct snap_crypt sc;
	struct layer_set ls;
};

static int setup(void **state)
{
	struct run_fx *f = calloc(1, sizeof(*f));
	if (!f)
		return -1;
	struct snap_crypt w = {0};
	assert_int_equal(crypto_key_generate(&w.key), 0);
	assert_int_equal(crypto_ctx_new(w.key, &w.cc), 0);
	assert_int_equal(crypto_random(w.chain_id, sizeof(w.chain_id)), 0);
	fx_mkdtemp(f->dir, sizeof(f->dir), "lazywin");
	fx_make_chain_sealed(&f->c, f->dir, 3, &w);
	assert_int_equal(crypto_key_import(crypto_key_bytes(w.key), &f->sc.key), 0);
	assert_int_equal(crypto_ctx_new(f->sc.key, &f->sc.cc), 0);
	memcpy(f->sc.chain_id, w.chain_id, 16);
	snap_crypt_close(&w);
	char err[512];
	assert_int_equal(layer_set_open(&f->ls, &f->c, 2, err, sizeof(err)), 0);
	for (int i = 0; i < f->ls.nr; i++)
		assert_int_equal(snap_crypt_check_layer(&f->sc, &f->ls.layers[i]), 0);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct run_fx *f = *state;
	layer_set_close(&f->ls);
	snap_crypt_close(&f->sc);
	fx_rmdir(f->dir);
	free(f);
	return 0;
}

static void open_all(struct run_fx *f, uint64_t first, uint64_t n, uint8_t *plain, int *res)
{
	uint8_t tags[FX_PAGES * CRYPTO_TAG_LEN];
	memset(plain, 0xee, n * MEM_LAYER_PAGE);
	lazy_open_run(&(struct lazy_src){f->sc.cc, f->sc.chain_id, &f->ls, NULL, true}, first, n,
		      plain, tags, res);
}

static void assert_page_is(const uint8_t *pg, uint8_t v, uint64_t p)
{
	for (size_t i = 0; i < MEM_LAYER_PAGE; i++)
		if (pg[i] != v)
			fail_msg("page %llu byte %zu is 0x%02x, expected 0x%02x",
				 (unsigned long long)p, i, pg[i], v);
}

/* Every page of a run comes from its newest layer, across layer boundaries, in one call. */
static void test_open_run_all_layers(void **state)
{
	struct run_fx *f = *state;
	uint8_t *plain = malloc(FX_PAGES * MEM_LAYER_PAGE);
	int res[FX_PAGES];
	assert_non_null(plain);
	open_all(f, 0, FX_PAGES, plain, res);
	for (uint64_t p = 0; p < FX_PAGES; p++) {
		assert_int_equal(res[p], 0);
		assert_page_is(plain + p * MEM_LAYER_PAGE, fx_expect(2, p), p);
	}
	open_all(f, 5, 3, plain, res); /* a run in the middle */
	for (uint64_t i = 0; i < 3; i++)
		assert_page_is(plain + i * MEM_LAYER_PAGE, fx_expect(2, 5 + i), 5 + i);
	free(plain);
}

static void flip(struct run_fx *f, int k, uint64_t off)
{
	char path[4200];
	snprintf(path, sizeof(path), "%s/%s", f->dir, f->c.layers[k].mem);
	int fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	uint8_t b;
	assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
	b ^= 1;
	assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
	close(fd);
}

/* One altered tag or page fails only that page (zeroed), never its neighbours in the run. */
static void test_open_run_tampered(void **state)
{
	struct run_fx *f = *state;
	uint8_t *plain = malloc(FX_PAGES * MEM_LAYER_PAGE);
	int res[FX_PAGES];
	assert_non_null(plain);
	const struct mem_layer *base = &f->ls.layers[0];
	flip(f, 0, base->info.tag_off + 12 * CRYPTO_TAG_LEN + 5);
	flip(f, 0, base->info.data_off + 13 * MEM_LAYER_PAGE + 4000);
	open_all(f, 0, FX_PAGES, plain, res);
	for (uint64_t p = 0; p < FX_PAGES; p++) {
		bool bad = (p == 12 || p == 13) && lazy_source(&f->ls, p) == base;
		if (bad) {
			assert_int_equal(res[p], -EBADMSG);
			assert_page_is(plain + p * MEM_LAYER_PAGE, 0, p);
		} else {
			assert_int_equal(res[p], 0);
			assert_page_is(plain + p * MEM_LAYER_PAGE, fx_expect(2, p), p);
		}
	}
	free(plain);
}

/* A layer file cut short after it was opened: its pages fail with -EIO, zeroed. */
static void test_open_run_short_read(void **state)
{
	struct run_fx *f = *state;
	uint8_t *plain = malloc(FX_PAGES * MEM_LAYER_PAGE);
	int res[FX_PAGES];
	assert_non_null(plain);
	const struct mem_layer *base = &f->ls.layers[0];
	char path[4200];
	snprintf(path, sizeof(path), "%s/%s", f->dir, f->c.layers[0].mem);
	assert_int_equal(truncate(path, (off_t)base->info.data_off), 0);
	open_all(f, 0, FX_PAGES, plain, res);
	int failed = 0;
	for (uint64_t p = 0; p < FX_PAGES; p++) {
		if (lazy_source(&f->ls, p) == base) {
			assert_int_equal(res[p], -EIO);
			assert_page_is(plain + p * MEM_LAYER_PAGE, 0, p);
			failed++;
		} else {
			assert_int_equal(res[p], 0);
		}
	}
	assert_true(failed > 0);
	free(plain);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_window_grows_when_sequential),
	    cmocka_unit_test(test_window_ram_ends),
	    cmocka_unit_test(test_window_stops_at_holes_and_filled),
	    cmocka_unit_test(test_next_run),
	    cmocka_unit_test_setup_teardown(test_open_run_all_layers, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_open_run_tampered, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_open_run_short_read, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
