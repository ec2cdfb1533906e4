/* Unit tests of snapshot/layer_seal.c: pages sealed in place on one or more threads and from
 * extents in any order give the same bytes, every tag lands at its place in whole 4 KiB tag
 * blocks, and bad extents are refused. */
#include "helpers.h"

#include <fcntl.h>

#include "snapshot/layer_seal.h"
#include "snapshot/seal_write.h"

#define DATA_OFF 8192ULL
#define NR_PAGES 8192ULL
#define TAG_OFF	 (DATA_OFF + NR_PAGES * 4096ULL)

static const uint8_t salt[CRYPTO_SALT_LEN] = {7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
static const uint8_t chain[CRYPTO_CHAIN_ID_LEN] = {1, 2, 3};

/* Runs of layer pages, [first, first + n), staged back to back. */
struct run {
	uint64_t first, n;
};
static const struct run runs[] = {{3, 3}, {300, 1}, {700, 401}, {5000, 2}, {5002, 1}};
#define NRUNS (sizeof(runs) / sizeof(runs[0]))

struct fx {
	struct snap_key *key;
	struct crypto_ctx *cc;
	uint8_t *plain, *buf;
	size_t len;
	struct write_extent ext[NRUNS];
};

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	assert_non_null(f);
	assert_int_equal(crypto_key_generate(&f->key), 0);
	assert_int_equal(crypto_ctx_new(f->key, &f->cc), 0);
	assert_int_equal(crypto_ctx_add_layer(f->cc, 9, salt), 0);
	uint64_t off = 0;
	for (size_t i = 0; i < NRUNS; i++) {
		f->ext[i] =
		    (struct write_extent){DATA_OFF + runs[i].first * 4096, off, runs[i].n * 4096};
		off += runs[i].n * 4096;
	}
	f->len = off;
	f->plain = malloc(f->len);
	f->buf = malloc(f->len);
	assert_non_null(f->plain);
	assert_non_null(f->buf);
	assert_int_equal(crypto_random(f->plain, f->len), 0);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;
	free(f->plain);
	free(f->buf);
	crypto_ctx_free(f->cc);
	crypto_key_free(f->key);
	free(f);
	return 0;
}

static struct seal_job job(struct fx *f, const struct write_extent *ext, size_t n)
{
	return (struct seal_job){.cc = f->cc,
				 .key = f->key,
				 .chain_id = chain,
				 .layer_id = 9,
				 .salt = salt,
				 .data_off = DATA_OFF,
				 .tag_off = TAG_OFF,
				 .buf = f->buf,
				 .ext = ext,
				 .n = n};
}

/* The tag of layer page p in the blocks `t` holds (NULL if no block holds it). */
static const uint8_t *tag_of(const struct seal_tags *t, uint64_t p)
{
	uint64_t want = TAG_OFF + p * 16;
	for (size_t i = 0; i < t->n; i++)
		if (want >= t->ext[i].file_off && want < t->ext[i].file_off + t->ext[i].len)
			return t->buf + t->ext[i].buf_off + (want - t->ext[i].file_off);
	return NULL;
}

static void check_sealed(struct fx *f, const struct seal_tags *t)
{
	uint8_t out[4096];
	uint64_t tagged = 0;
	for (size_t i = 0; i < NRUNS; i++)
		for (uint64_t k = 0; k < runs[i].n; k++) {
			uint64_t p = runs[i].first + k;
			const uint8_t *c = f->buf + f->ext[i].buf_off + k * 4096;
			assert_memory_not_equal(c, f->plain + f->ext[i].buf_off + k * 4096, 4096);
			const uint8_t *tag = tag_of(t, p);
			assert_non_null(tag);
			assert_int_equal(crypto_open_page(f->cc, chain, 9, p, c, 4096, out, tag),
					 0);
			assert_memory_equal(out, f->plain + f->ext[i].buf_off + k * 4096, 4096);
			tagged++;
		}
	/* Blocks are whole, aligned, going up the file; every other entry is zero. */
	uint64_t nonzero = 0;
	for (size_t i = 0; i < t->n; i++) {
		assert_int_equal(t->ext[i].file_off % 4096, 0);
		assert_int_equal(t->ext[i].len % 4096, 0);
		assert_int_equal(t->ext[i].buf_off % 4096, 0);
		if (i)
			assert_true(t->ext[i].file_off >
				    t->ext[i - 1].file_off + t->ext[i - 1].len);
	}
	for (size_t e = 0; e < t->len / 16; e++) {
		static const uint8_t zero[16];
		nonzero += memcmp(t->buf + e * 16, zero, 16) != 0;
	}
	assert_int_equal(nonzero, tagged);
	/* Pages 3..5, 300, 700..1100 use blocks 0..4 (one extent); 5000..5002 block 19. */
	assert_int_equal(t->n, 2);
	assert_int_equal(t->ext[0].file_off, TAG_OFF);
	assert_int_equal(t->ext[0].len, 5 * 4096);
	assert_int_equal(t->ext[1].file_off, TAG_OFF + 19 * 4096);
	assert_int_equal(t->ext[1].len, 4096);
	assert_int_equal(t->len, 6 * 4096);
}

/* One thread and several give the same ciphertext and tags (the nonce is the page's). */
static void test_seal_threads_agree(void **state)
{
	struct fx *f = *state;
	uint8_t *one = malloc(f->len);
	assert_non_null(one);
	struct seal_tags t1, t3;
	memcpy(f->buf, f->plain, f->len);
	struct seal_job j = job(f, f->ext, NRUNS);
	assert_int_equal(layer_seal(&j, 1, &t1), 0);
	check_sealed(f, &t1);
	memcpy(one, f->buf, f->len);
	memcpy(f->buf, f->plain, f->len);
	assert_int_equal(layer_seal(&j, 3, &t3), 0);
	check_sealed(f, &t3);
	assert_memory_equal(one, f->buf, f->len);
	assert_int_equal(t1.len, t3.len);
	assert_memory_equal(t1.buf, t3.buf, t1.len);
	seal_tags_free(&t1);
	seal_tags_free(&t3);
	free(one);
}

/*
 * Extents in any order seal as they do going up the file: a snapshot's pause appends the pages
 * written since its pre-copy after the pre-copy's extents (an encrypted Diff failed with
 * EINVAL in the KVM box whenever one of them lay below the pre-copy's last page).
 */
static void test_seal_any_order(void **state)
{
	struct fx *f = *state;
	struct write_extent rev[NRUNS];
	struct seal_tags t1, t2;
	uint8_t *one = malloc(f->len);
	assert_non_null(one);
	memcpy(f->buf, f->plain, f->len);
	struct seal_job j = job(f, f->ext, NRUNS);
	assert_int_equal(layer_seal(&j, 1, &t1), 0);
	memcpy(one, f->buf, f->len);
	for (size_t i = 0; i < NRUNS; i++)
		rev[i] = f->ext[NRUNS - 1 - i];
	memcpy(f->buf, f->plain, f->len);
	j = job(f, rev, NRUNS);
	assert_int_equal(layer_seal(&j, 3, &t2), 0);
	check_sealed(f, &t2);
	assert_memory_equal(one, f->buf, f->len);
	assert_int_equal(t1.len, t2.len);
	assert_memory_equal(t1.buf, t2.buf, t1.len);
	/* The caller's extents are left as they were. */
	assert_int_equal(rev[0].file_off, f->ext[NRUNS - 1].file_off);
	seal_tags_free(&t1);
	seal_tags_free(&t2);
	free(one);
}

/* Misaligned or overlapping extents are refused, and nothing is left allocated. */
static void test_seal_bad_extents(void **state)
{
	struct fx *f = *state;
	struct seal_tags t;
	struct write_extent bad[2] = {{DATA_OFF + 4096 + 16, 0, 4096}};
	struct seal_job j = job(f, bad, 1);
	assert_int_equal(layer_seal(&j, 2, &t), -EINVAL);
	assert_null(t.buf);
	bad[0] = (struct write_extent){DATA_OFF - 4096, 0, 4096};
	assert_int_equal(layer_seal(&j, 1, &t), -EINVAL);
	/* One page in two extents (given in descending order). */
	bad[0] = (struct write_extent){DATA_OFF + 2 * 4096, 0, 4096};
	bad[1] = (struct write_extent){DATA_OFF + 4096, 4096, 2 * 4096};
	j = job(f, bad, 2);
	assert_int_equal(layer_seal(&j, 1, &t), -EINVAL);
	assert_null(t.ext);
	/* An unregistered layer: the sealing error comes back. */
	memcpy(f->buf, f->plain, f->len);
	j = job(f, f->ext, NRUNS);
	j.layer_id = 10;
	assert_int_equal(layer_seal(&j, 1, &t), -ENOKEY);
	assert_null(t.buf);
}

/* No pages: nothing sealed, no tag blocks. */
static void test_seal_empty(void **state)
{
	struct fx *f = *state;
	struct seal_tags t;
	struct seal_job j = job(f, f->ext, 0);
	assert_int_equal(layer_seal(&j, 4, &t), 0);
	assert_int_equal(t.n, 0);
	assert_int_equal(t.len, 0);
	seal_tags_free(&t);
}

/* The layer file as layer_seal_write leaves it: ciphertext at each page, tags at theirs. */
static void check_file(struct fx *f, int fd, const uint8_t *cipher, const struct seal_tags *t)
{
	uint8_t got[4096];
	for (size_t i = 0; i < NRUNS; i++)
		for (uint64_t k = 0; k < runs[i].n; k++) {
			uint64_t off = f->ext[i].buf_off + k * 4096;
			assert_int_equal(
			    pread(fd, got, 4096, (off_t)(f->ext[i].file_off + k * 4096)), 4096);
			assert_memory_equal(got, cipher + off, 4096);
			assert_int_equal(
			    pread(fd, got, 16, (off_t)(TAG_OFF + (runs[i].first + k) * 16)), 16);
			assert_memory_equal(got, tag_of(t, runs[i].first + k), 16);
		}
}

/*
 * Sealing batch by batch while the ring writes (layer_seal_write) gives the file layer_seal
 * and a plain write give: extents in any order, cut into batches of 16 pages (the 401-page run
 * spans many), through io_uring and the pwrite loop, with and without a helper sealing ahead.
 */
static void test_seal_write_pipeline(void **state)
{
	struct fx *f = *state;
	struct write_extent rev[NRUNS];
	struct seal_tags ref;
	uint8_t *cipher = malloc(f->len);
	assert_non_null(cipher);
	memcpy(f->buf, f->plain, f->len);
	struct seal_job j = job(f, f->ext, NRUNS);
	assert_int_equal(layer_seal(&j, 1, &ref), 0);
	memcpy(cipher, f->buf, f->len);
	for (size_t i = 0; i < NRUNS; i++)
		rev[i] = f->ext[NRUNS - 1 - i];
	for (int m = 0; m < 4; m++) {
		char path[] = "/tmp/cove-seal-write-XXXXXX";
		int fd = mkstemp(path);
		assert_true(fd >= 0);
		unlink(path);
		memcpy(f->buf, f->plain, f->len);
		j = job(f, rev, NRUNS);
		/* io_uring and pwrite, each with and without the helper */
		assert_int_equal(layer_seal_write(NULL, fd, m % 2 ? WRITE_PWRITE : WRITE_URING, &j,
						  f->len, 16 * 4096, (unsigned)m / 2, NULL, NULL),
				 0);
		check_file(f, fd, cipher, &ref);
		close(fd);
	}
	/* A layer the caller's context lacks: the sealing error ends the write (a helper keys a
	 * context of its own from the job's key, so this is the writer's error alone). */
	int fd = open("/tmp", O_TMPFILE | O_RDWR, 0600);
	assert_true(fd >= 0);
	memcpy(f->buf, f->plain, f->len);
	j = job(f, f->ext, NRUNS);
	j.layer_id = 10;
	assert_int_equal(
	    layer_seal_write(NULL, fd, WRITE_URING, &j, f->len, 16 * 4096, 0, NULL, NULL), -ENOKEY);
	/* A batch size below a page is refused. */
	j.layer_id = 9;
	assert_int_equal(layer_seal_write(NULL, fd, WRITE_URING, &j, f->len, 100, 1, NULL, NULL),
			 -EINVAL);
	close(fd);
	seal_tags_free(&ref);
	free(cipher);
}

static int fail_third(void *opaque, size_t e0, size_t e1)
{
	int *calls = opaque;
	(void)e0;
	(void)e1;
	return ++*calls == 3 ? -EIO : 0;
}

/* A prepare error ends layer_write_extents_prepared with it, after two batches went out. */
static void test_prepared_error(void **state)
{
	struct fx *f = *state;
	int fd = open("/tmp", O_TMPFILE | O_RDWR, 0600), calls = 0;
	assert_true(fd >= 0);
	assert_int_equal(layer_write_extents_prepared(NULL, fd, WRITE_URING, f->buf, f->len, f->ext,
						      NRUNS, 4096, fail_third, &calls, NULL, NULL),
			 -EIO);
	assert_int_equal(calls, 3);
	calls = 0;
	assert_int_equal(layer_write_extents_prepared(NULL, fd, WRITE_PWRITE, f->buf, f->len,
						      f->ext, NRUNS, 4096, fail_third, &calls, NULL,
						      NULL),
			 -EIO);
	close(fd);
}

static void test_seal_threads_bounds(void **state)
{
	(void)state;
	assert_int_equal(layer_seal_threads(0), 1);
	assert_int_equal(layer_seal_threads(SEAL_PAGES_PER_THREAD_MIN - 1), 1);
	assert_in_range(layer_seal_threads(1ULL << 30), 1, SEAL_THREADS_MAX);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_seal_threads_agree, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_seal_any_order, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_seal_bad_extents, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_seal_empty, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_seal_write_pipeline, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_prepared_error, setup, teardown),
	    cmocka_unit_test(test_seal_threads_bounds),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
