/* Unit tests of snapshot/crypto: nonces, page and blob sealing, AAD binding, tampering, keys,
 * sealed disk layers. */
#include <errno.h>
#include <fcntl.h>
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
#include "file_helpers.h"

#include "common/byteorder.h"
#include "common/crc32.h"
#include "snapshot/crypto.h"
#include "devices/overlay.h"
#include "snapshot/snap_crypt.h"

#define PAGE 4096

struct fx {
	struct snap_key *key;
	struct crypto_ctx *cc;
	uint8_t chain[CRYPTO_CHAIN_ID_LEN];
	uint8_t plain[2][PAGE];
	uint8_t cipher[2][PAGE];
	uint8_t tag[2][CRYPTO_TAG_LEN];
	uint8_t out[PAGE];
};

/* A fixed, non-zero salt per layer id, so two contexts agree. */
static void salt_of(uint64_t layer, uint8_t salt[CRYPTO_SALT_LEN])
{
	for (int i = 0; i < CRYPTO_SALT_LEN; i++)
		salt[i] = (uint8_t)(layer * 37 + (uint64_t)i + 1);
}

/* Registers the layers the tests use (pages are never sealed under the data key itself). */
static void add_layers(struct crypto_ctx *cc)
{
	static const uint64_t ids[] = {1, 2, 3, 4, 5, 9};
	uint8_t salt[CRYPTO_SALT_LEN];
	for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
		salt_of(ids[i], salt);
		assert_int_equal(crypto_ctx_add_layer(cc, ids[i], salt), 0);
	}
}

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	assert_non_null(f);
	assert_int_equal(crypto_key_generate(&f->key), 0);
	assert_int_equal(crypto_ctx_new(f->key, &f->cc), 0);
	add_layers(f->cc);
	assert_int_equal(crypto_random(f->chain, sizeof(f->chain)), 0);
	for (int p = 0; p < 2; p++)
		for (int i = 0; i < PAGE; i++)
			f->plain[p][i] = (uint8_t)(i * 31 + p * 7 + 1);
	/* page 0 of layer 3 and page 1 of layer 3 */
	assert_int_equal(
	    crypto_seal_page(f->cc, f->chain, 3, 0, f->plain[0], PAGE, f->cipher[0], f->tag[0]), 0);
	assert_int_equal(
	    crypto_seal_page(f->cc, f->chain, 3, 1, f->plain[1], PAGE, f->cipher[1], f->tag[1]), 0);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;
	crypto_ctx_free(f->cc);
	crypto_key_free(f->key);
	free(f);
	return 0;
}

static int open_page(struct fx *f, uint64_t layer, uint64_t index, const uint8_t *c,
		     const uint8_t *tag)
{
	return crypto_open_page(f->cc, f->chain, layer, index, c, PAGE, f->out, tag);
}

/* Distinct (layer, index) pairs give distinct nonces; the encoding is layer(32) || index(64). */
static void test_nonce_unique(void **state)
{
	(void)state;
	static const uint64_t layers[] = {0, 1, 2, 255, 256, 0x10000, 0xfffffffeULL};
	static const uint64_t idx[] = {0,	  1, 2, 255, 256, 0xffffffffULL, 0x100000000ULL,
				       UINT64_MAX};
	enum { NL = sizeof(layers) / 8, NI = sizeof(idx) / 8 };
	uint8_t n[NL * NI][CRYPTO_NONCE_LEN];
	for (size_t l = 0; l < NL; l++)
		for (size_t i = 0; i < NI; i++)
			assert_int_equal(crypto_page_nonce(layers[l], idx[i], n[l * NI + i]), 0);
	for (size_t a = 0; a < NL * NI; a++)
		for (size_t b = a + 1; b < NL * NI; b++)
			assert_memory_not_equal(n[a], n[b], CRYPTO_NONCE_LEN);
	/* exhaustive over a dense block: layers 0..63 x pages 0..1023, checked by decoding */
	for (uint64_t l = 0; l < 64; l++)
		for (uint64_t i = 0; i < 1024; i++) {
			uint8_t x[CRYPTO_NONCE_LEN];
			assert_int_equal(crypto_page_nonce(l, i, x), 0);
			uint64_t dl = (uint64_t)x[0] << 24 | x[1] << 16 | x[2] << 8 | x[3];
			uint64_t di = 0;
			for (int k = 4; k < 12; k++)
				di = di << 8 | x[k];
			assert_true(dl == l && di == i); /* injective: decodes back */
		}
	uint8_t x[CRYPTO_NONCE_LEN];
	assert_int_equal(crypto_page_nonce(0xfffffffeULL, 5, x), 0);
	const uint8_t want[] = {0xff, 0xff, 0xff, 0xfe, 0, 0, 0, 0, 0, 0, 0, 5};
	assert_memory_equal(x, want, sizeof(want));
}

static void test_layer_overflow_rejected(void **state)
{
	struct fx *f = *state;
	uint8_t x[CRYPTO_NONCE_LEN], tag[CRYPTO_TAG_LEN];
	assert_int_equal(crypto_page_nonce(0xffffffffULL, 0, x), -ERANGE); /* blob space */
	assert_int_equal(crypto_page_nonce(0x100000000ULL, 0, x), -ERANGE);
	assert_int_equal(crypto_page_nonce(UINT64_MAX, 0, x), -ERANGE);
	assert_int_equal(
	    crypto_seal_page(f->cc, f->chain, 0x100000000ULL, 0, f->plain[0], PAGE, f->out, tag),
	    -ERANGE);
	assert_int_equal(open_page(f, 0x100000000ULL, 0, f->cipher[0], f->tag[0]), -ERANGE);
	assert_int_equal(crypto_seal_page(f->cc, f->chain, 1, 0, f->plain[0], 0, f->out, tag),
			 -EINVAL);
}

static void test_round_trip(void **state)
{
	struct fx *f = *state;
	assert_memory_not_equal(f->cipher[0], f->plain[0], PAGE);
	assert_int_equal(open_page(f, 3, 0, f->cipher[0], f->tag[0]), 0);
	assert_memory_equal(f->out, f->plain[0], PAGE);
	assert_int_equal(open_page(f, 3, 1, f->cipher[1], f->tag[1]), 0);
	assert_memory_equal(f->out, f->plain[1], PAGE);
	/* in place, odd length (a short last disk chunk) */
	uint8_t buf[1000], tag[CRYPTO_TAG_LEN];
	memcpy(buf, f->plain[0], sizeof(buf));
	assert_int_equal(crypto_seal_page(f->cc, f->chain, 9, 77, buf, sizeof(buf), buf, tag), 0);
	assert_int_equal(crypto_open_page(f->cc, f->chain, 9, 77, buf, sizeof(buf), buf, tag), 0);
	assert_memory_equal(buf, f->plain[0], sizeof(buf));
	/* a second context on the same key (another thread) reads what the first wrote */
	struct crypto_ctx *cc2;
	assert_int_equal(crypto_ctx_new(f->key, &cc2), 0);
	add_layers(cc2);
	assert_int_equal(
	    crypto_open_page(cc2, f->chain, 3, 0, f->cipher[0], PAGE, f->out, f->tag[0]), 0);
	assert_memory_equal(f->out, f->plain[0], PAGE);
	crypto_ctx_free(cc2);
	/* deterministic: same key, place and data give the same ciphertext */
	uint8_t again[PAGE];
	assert_int_equal(crypto_seal_page(f->cc, f->chain, 3, 0, f->plain[0], PAGE, again, tag), 0);
	assert_memory_equal(again, f->cipher[0], PAGE);
	assert_memory_equal(tag, f->tag[0], CRYPTO_TAG_LEN);
}

/* A page opened at another index, layer, chain or length, or with another key, fails. */
static void test_aad_binding(void **state)
{
	struct fx *f = *state;
	assert_int_equal(open_page(f, 3, 1, f->cipher[0], f->tag[0]), -EBADMSG); /* as page 1 */
	assert_int_equal(open_page(f, 4, 0, f->cipher[0], f->tag[0]), -EBADMSG); /* layer 4 */
	assert_int_equal(open_page(f, 2, 0, f->cipher[0], f->tag[0]), -EBADMSG);
	for (int i = 0; i < PAGE; i++)
		assert_int_equal(f->out[i], 0); /* nothing of a failed open is left behind */
	uint8_t other[CRYPTO_CHAIN_ID_LEN];
	memcpy(other, f->chain, sizeof(other));
	other[15] ^= 1;
	assert_int_equal(
	    crypto_open_page(f->cc, other, 3, 0, f->cipher[0], PAGE, f->out, f->tag[0]), -EBADMSG);
	assert_int_equal(
	    crypto_open_page(f->cc, f->chain, 3, 0, f->cipher[0], PAGE - 16, f->out, f->tag[0]),
	    -EBADMSG);
	struct snap_key *k2;
	struct crypto_ctx *cc2;
	assert_int_equal(crypto_key_generate(&k2), 0);
	assert_int_equal(crypto_ctx_new(k2, &cc2), 0);
	add_layers(cc2); /* same salts, another data key: other subkeys */
	assert_int_equal(
	    crypto_open_page(cc2, f->chain, 3, 0, f->cipher[0], PAGE, f->out, f->tag[0]), -EBADMSG);
	crypto_ctx_free(cc2);
	crypto_key_free(k2);
}

/* Swapping two pages' ciphertext (with or without their tags) fails both. */
static void test_swap_pages(void **state)
{
	struct fx *f = *state;
	assert_int_equal(open_page(f, 3, 0, f->cipher[1], f->tag[1]), -EBADMSG);
	assert_int_equal(open_page(f, 3, 1, f->cipher[0], f->tag[0]), -EBADMSG);
	assert_int_equal(open_page(f, 3, 0, f->cipher[1], f->tag[0]), -EBADMSG);
	assert_int_equal(open_page(f, 3, 1, f->cipher[0], f->tag[1]), -EBADMSG);
	/* the same page replayed from another layer */
	uint8_t c[PAGE], tag[CRYPTO_TAG_LEN];
	assert_int_equal(crypto_seal_page(f->cc, f->chain, 5, 0, f->plain[0], PAGE, c, tag), 0);
	assert_memory_not_equal(c, f->cipher[0], PAGE); /* another nonce */
	assert_int_equal(open_page(f, 3, 0, c, tag), -EBADMSG);
	assert_int_equal(open_page(f, 5, 0, c, tag), 0);
}

/* Any flipped bit in ciphertext or tag fails. */
static void test_tamper(void **state)
{
	struct fx *f = *state;
	uint8_t c[PAGE], tag[CRYPTO_TAG_LEN];
	static const int where[] = {0, 1, 100, 2047, 4094, 4095};
	for (size_t w = 0; w < sizeof(where) / sizeof(where[0]); w++) {
		memcpy(c, f->cipher[0], PAGE);
		c[where[w]] ^= 0x01;
		assert_int_equal(open_page(f, 3, 0, c, f->tag[0]), -EBADMSG);
	}
	for (int b = 0; b < CRYPTO_TAG_LEN; b++) {
		memcpy(tag, f->tag[0], sizeof(tag));
		tag[b] ^= 0x80;
		assert_int_equal(open_page(f, 3, 0, f->cipher[0], tag), -EBADMSG);
	}
	assert_int_equal(open_page(f, 3, 0, f->cipher[0], f->tag[0]), 0); /* still intact */
}

static void test_blob(void **state)
{
	struct fx *f = *state;
	const char msg[] = "vcpu state, devices, and so on";
	size_t n = sizeof(msg);
	uint8_t b1[sizeof(msg) + CRYPTO_BLOB_OVERHEAD], b2[sizeof(b1)], out[sizeof(msg)];
	assert_int_equal(crypto_seal_blob(f->cc, f->chain, "state", msg, n, b1), 0);
	assert_int_equal(crypto_seal_blob(f->cc, f->chain, "state", msg, n, b2), 0);
	assert_memory_not_equal(b1, b2, sizeof(b1));	       /* random nonce */
	assert_int_equal(b1[0] & b1[1] & b1[2] & b1[3], 0xff); /* reserved layer */
	assert_int_equal(crypto_open_blob(f->cc, f->chain, "state", b1, sizeof(b1), out), 0);
	assert_string_equal((char *)out, msg);
	assert_int_equal(crypto_open_blob(f->cc, f->chain, "meta", b1, sizeof(b1), out), -EBADMSG);
	uint8_t other[CRYPTO_CHAIN_ID_LEN];
	memcpy(other, f->chain, sizeof(other));
	other[0] ^= 1;
	assert_int_equal(crypto_open_blob(f->cc, other, "state", b1, sizeof(b1), out), -EBADMSG);
	for (size_t i = 0; i < sizeof(b1); i++) {
		memcpy(b2, b1, sizeof(b1));
		b2[i] ^= 4;
		assert_int_equal(crypto_open_blob(f->cc, f->chain, "state", b2, sizeof(b2), out),
				 -EBADMSG);
	}
	/* truncated by one byte, and shorter than the overhead */
	assert_int_equal(crypto_open_blob(f->cc, f->chain, "state", b1, sizeof(b1) - 1, out),
			 -EBADMSG);
	assert_int_equal(crypto_open_blob(f->cc, f->chain, "state", b1, 27, out), -EBADMSG);
	/* empty blob */
	uint8_t e[CRYPTO_BLOB_OVERHEAD];
	assert_int_equal(crypto_seal_blob(f->cc, f->chain, "empty", NULL, 0, e), 0);
	assert_int_equal(crypto_open_blob(f->cc, f->chain, "empty", e, sizeof(e), out), 0);
	/* a sealed page is not a blob: its nonce is not in the reserved layer */
	uint8_t fake[PAGE + CRYPTO_BLOB_OVERHEAD];
	assert_int_equal(crypto_open_blob(f->cc, f->chain, "state", fake, 0, out), -EBADMSG);
	memset(fake, 0, sizeof(fake));
	assert_int_equal(crypto_open_blob(f->cc, f->chain, "state", fake, sizeof(fake), f->out),
			 -EBADMSG);
}

static void test_key_import_and_lock(void **state)
{
	struct fx *f = *state;
	struct snap_key *k2;
	struct crypto_ctx *cc2;
	assert_int_equal(crypto_key_import(crypto_key_bytes(f->key), &k2), 0);
	assert_memory_equal(crypto_key_bytes(k2), crypto_key_bytes(f->key), CRYPTO_KEY_LEN);
	assert_int_equal(crypto_ctx_new(k2, &cc2), 0);
	add_layers(cc2);
	assert_int_equal(
	    crypto_open_page(cc2, f->chain, 3, 1, f->cipher[1], PAGE, f->out, f->tag[1]), 0);
	assert_memory_equal(f->out, f->plain[1], PAGE);
	print_message("data key mlock'ed: %s\n", crypto_key_locked(k2) ? "yes" : "no");
	crypto_ctx_free(cc2);
	crypto_key_free(k2);
	struct snap_key *a, *b;
	assert_int_equal(crypto_key_generate(&a), 0);
	assert_int_equal(crypto_key_generate(&b), 0);
	assert_memory_not_equal(crypto_key_bytes(a), crypto_key_bytes(b), CRYPTO_KEY_LEN);
	crypto_key_free(a);
	crypto_key_free(b);
	crypto_key_free(NULL);
	crypto_ctx_free(NULL);
}

/*
 * Issue 12 item 5: a layer id sealed twice under one data key (a rolled-back counter, two
 * copies of a chain) still never repeats a (key, nonce) pair: each layer's random salt gives
 * it its own subkey. Pages are never sealed under the data key or an unregistered layer.
 */
static void test_salt_separates_layers(void **state)
{
	struct fx *f = *state;
	uint8_t sa[CRYPTO_SALT_LEN], sb[CRYPTO_SALT_LEN], zero[CRYPTO_SALT_LEN] = {0};
	uint8_t ka[CRYPTO_KEY_LEN], kb[CRYPTO_KEY_LEN];
	uint8_t ca[PAGE], cb[PAGE], ta[CRYPTO_TAG_LEN], tb[CRYPTO_TAG_LEN];
	struct crypto_ctx *a, *b;
	assert_int_equal(crypto_random(sa, sizeof(sa)), 0);
	assert_int_equal(crypto_random(sb, sizeof(sb)), 0);
	assert_int_equal(crypto_ctx_new(f->key, &a), 0);
	assert_int_equal(crypto_ctx_new(f->key, &b), 0);
	/* unregistered: refused, never sealed under the data key */
	assert_int_equal(crypto_seal_page(a, f->chain, 7, 0, f->plain[0], PAGE, ca, ta), -ENOKEY);
	assert_int_equal(crypto_ctx_add_layer(a, 7, zero), -EINVAL);
	assert_int_equal(crypto_ctx_add_layer(a, 7, sa), 0);
	assert_int_equal(crypto_ctx_add_layer(b, 7, sb), 0);
	/* the same id, index and data under the same data key: different bytes and tags */
	assert_int_equal(crypto_seal_page(a, f->chain, 7, 0, f->plain[0], PAGE, ca, ta), 0);
	assert_int_equal(crypto_seal_page(b, f->chain, 7, 0, f->plain[0], PAGE, cb, tb), 0);
	assert_memory_not_equal(ca, cb, PAGE);
	assert_memory_not_equal(ta, tb, CRYPTO_TAG_LEN);
	/* the keystreams differ: XOR of the two ciphertexts is not zero anywhere near all */
	size_t same = 0;
	for (size_t i = 0; i < PAGE; i++)
		same += ca[i] == cb[i];
	assert_true(same < PAGE / 64);
	/* subkeys differ from each other and from the data key */
	assert_int_equal(crypto_layer_key(f->key, 7, sa, ka), 0);
	assert_int_equal(crypto_layer_key(f->key, 7, sb, kb), 0);
	assert_memory_not_equal(ka, kb, CRYPTO_KEY_LEN);
	assert_memory_not_equal(ka, crypto_key_bytes(f->key), CRYPTO_KEY_LEN);
	/* each opens only under its own salt */
	assert_int_equal(crypto_open_page(a, f->chain, 7, 0, cb, PAGE, f->out, tb), -EBADMSG);
	assert_int_equal(crypto_open_page(b, f->chain, 7, 0, cb, PAGE, f->out, tb), 0);
	assert_memory_equal(f->out, f->plain[0], PAGE);
	/* a duplicate context carries the registered layers (the lazy restore thread) */
	struct crypto_ctx *d;
	assert_int_equal(crypto_ctx_dup(a, &d), 0);
	assert_int_equal(crypto_open_page(d, f->chain, 7, 0, ca, PAGE, f->out, ta), 0);
	assert_memory_equal(f->out, f->plain[0], PAGE);
	crypto_ctx_free(d);
	crypto_ctx_free(a);
	crypto_ctx_free(b);
}

/* ---- sealed disk overlay layers (issue 12 item 4) ---- */

#define OCHUNK (64u << 10)
#define ODISK  (4 * OCHUNK + 12288)
static const char SECRET[] = "cove-secret-disk-pattern-7f3a";

static bool file_holds(const char *path, const char *needle)
{
	size_t len;
	uint8_t *b = read_file(path, &len);
	bool hit = memmem(b, len, needle, strlen(needle)) != NULL;
	free(b);
	return hit;
}

static void flip(const char *path, off_t off)
{
	int fd = open(path, O_RDWR);
	uint8_t b;
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &b, 1, off), 1);
	b ^= 0x40;
	assert_int_equal(pwrite(fd, &b, 1, off), 1);
	close(fd);
}

static int odisk_read(struct overlay *ov, uint64_t off, uint8_t *buf, size_t len)
{
	struct iovec iov = {buf, len};
	return overlay_read(ov, off, &iov, 1, len);
}

/*
 * A frozen layer of an encrypted chain holds no plaintext (data or map), reads back through the
 * sealer only after its map authenticated, and a flipped byte of its data or map is refused.
 */
static void test_sealed_overlay(void **state)
{
	struct fx *f = *state;
	char dir[64] = "/tmp/cove-seal-XXXXXX", base[128], l0[128], l0map[140], top[128], top2[128];
	char err[512];
	assert_non_null(mkdtemp(dir));
	snprintf(base, sizeof(base), "%s/base", dir);
	snprintf(l0, sizeof(l0), "%s/disk0-000001.ovl", dir);
	snprintf(l0map, sizeof(l0map), "%s.map", l0);
	snprintf(top, sizeof(top), "%s/disk0-000002.ovl", dir);
	snprintf(top2, sizeof(top2), "%s/disk0-r000002-1.ovl", dir);
	uint8_t *want = malloc(ODISK), *got = malloc(ODISK);
	for (size_t i = 0; i < ODISK; i++)
		want[i] = (uint8_t)(i * 7 + 3);
	write_file(base, want, ODISK);
	struct snap_crypt sc = {.key = f->key, .cc = f->cc};
	memcpy(sc.chain_id, f->chain, sizeof(sc.chain_id));
	struct snap_sealer *sealer;
	assert_int_equal(snap_sealer_new(&sc, &sealer), 0);

	struct overlay ov;
	assert_int_equal(overlay_open(&ov, base, l0, OCHUNK, err, sizeof(err)), 0);
	/* the secret, whole in chunk 0, partly in chunk 2 (copy-up), and in the short last chunk */
	static const uint64_t at[] = {100, 2 * OCHUNK + 5000, 4 * OCHUNK + 100};
	for (size_t i = 0; i < 3; i++) {
		struct iovec iov = {(void *)SECRET, sizeof(SECRET)};
		assert_int_equal(overlay_write(&ov, at[i], &iov, 1, sizeof(SECRET)), 0);
		memcpy(want + at[i], SECRET, sizeof(SECRET));
	}
	assert_true(file_holds(l0, SECRET)); /* the live top is in clear, as guest RAM is */
	ov.sealer = &sealer->ops;
	ov.seal_layer_id = 1;
	int fr = overlay_freeze(&ov, top, err, sizeof(err));
	if (fr)
		fail_msg("freeze: %s", err);
	/* the plain top is emptied; the sealed layer is new files beside it */
	assert_false(file_holds(l0, SECRET));
	assert_false(file_holds(l0map, SECRET));
	char sl0[160];
	assert_int_equal(overlay_layer_path(&ov, 0, sl0, sizeof(sl0)), 0);
	snprintf(l0, sizeof(l0), "%s/disk0-000001-sealed.ovl", dir);
	assert_string_equal(sl0, l0);
	snprintf(l0map, sizeof(l0map), "%s.map", l0);
	assert_false(file_holds(l0, SECRET));
	assert_false(file_holds(l0map, SECRET));
	size_t mlen;
	uint8_t *map = read_file(l0map, &mlen);
	struct overlay_map_info info;
	assert_int_equal(overlay_map_parse(map, mlen, &info, err, sizeof(err)), 0);
	assert_int_equal(info.version, 3);
	assert_int_equal(info.flags, OVERLAY_MAP_FROZEN | OVERLAY_MAP_SEALED);
	assert_int_equal(info.layer_id, 1);
	/* the running sandbox reads its sealed layer, and copies up from it */
	assert_int_equal(odisk_read(&ov, 0, got, ODISK), 0);
	assert_memory_equal(got, want, ODISK);
	struct iovec one = {(void *)"X", 1};
	assert_int_equal(overlay_write(&ov, 110, &one, 1, 1), 0);
	want[110] = 'X';
	assert_int_equal(odisk_read(&ov, 0, got, ODISK), 0);
	assert_memory_equal(got, want, ODISK);
	assert_int_equal(overlay_close(&ov), 0);
	want[110] = SECRET[10];

	/* restore: a new top on the frozen layer; nothing is read before the map authenticates */
	const char *chain[] = {l0, top2};
	assert_int_equal(overlay_open_chain(&ov, base, chain, 2, 0, err, sizeof(err)), 0);
	int ns, np;
	overlay_count_sealed(&ov, &ns, &np);
	assert_int_equal(ns, 1);
	assert_int_equal(np, 0);
	assert_int_equal(odisk_read(&ov, 0, got, 4096), -EACCES);
	assert_int_equal(overlay_attach_sealer(&ov, &sealer->ops, err, sizeof(err)), 0);
	assert_int_equal(odisk_read(&ov, 0, got, ODISK), 0);
	assert_memory_equal(got, want, ODISK);
	assert_int_equal(overlay_verify_sealed(&ov, err, sizeof(err)), 0);
	/* one flipped byte of sealed data: an I/O error, never the altered bytes */
	flip(l0, 2 * OCHUNK + 7);
	memset(got, 0xee, 4096);
	assert_int_equal(odisk_read(&ov, 2 * OCHUNK, got, 4096), -EBADMSG);
	for (int i = 0; i < 4096; i++)
		assert_int_equal(got[i], 0xee);
	assert_int_equal(overlay_verify_sealed(&ov, err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "chunk 2 failed authentication"));
	flip(l0, 2 * OCHUNK + 7);
	/* a flipped tag too */
	flip(l0, ODISK + 4 * OVERLAY_TAG_LEN + 3);
	assert_int_equal(odisk_read(&ov, 4 * OCHUNK, got, 100), -EBADMSG);
	flip(l0, ODISK + 4 * OVERLAY_TAG_LEN + 3);
	assert_int_equal(overlay_close(&ov), 0);
	unlink(top2);
	char top2map[140];
	snprintf(top2map, sizeof(top2map), "%s.map", top2);
	unlink(top2map);

	/* the map: a bit set in the bitmap with both CRCs made right again */
	uint8_t *bad = malloc(mlen);
	memcpy(bad, map, mlen);
	bad[OVERLAY_MAP_HDR_SEALED] |= 2; /* chunk 1: never written */
	put_le32(bad + 32,
		 crc32_update(0, bad + OVERLAY_MAP_HDR_SEALED, mlen - OVERLAY_MAP_HDR_SEALED));
	put_le32(bad + OVERLAY_MAP_HDR_SEALED - 4,
		 crc32_update(0, bad, OVERLAY_MAP_HDR_SEALED - 4));
	write_file(l0map, bad, mlen);
	assert_int_equal(overlay_open_chain(&ov, base, chain, 2, 0, err, sizeof(err)), 0);
	assert_int_equal(overlay_attach_sealer(&ov, &sealer->ops, err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "failed authentication"));
	assert_int_equal(odisk_read(&ov, OCHUNK, got, 4096), -EACCES);
	assert_int_equal(overlay_close(&ov), 0);
	unlink(top2);
	unlink(top2map);
	/* another chain's key cannot authenticate it either */
	write_file(l0map, map, mlen);
	struct snap_key *k2;
	struct snap_crypt sc2 = {0};
	struct snap_sealer *other;
	assert_int_equal(crypto_key_generate(&k2), 0);
	sc2.key = k2;
	memcpy(sc2.chain_id, f->chain, sizeof(sc2.chain_id));
	assert_int_equal(snap_sealer_new(&sc2, &other), 0);
	assert_int_equal(overlay_open_chain(&ov, base, chain, 2, 0, err, sizeof(err)), 0);
	assert_int_equal(overlay_attach_sealer(&ov, &other->ops, err, sizeof(err)), -EBADMSG);
	assert_int_equal(overlay_close(&ov), 0);
	snap_sealer_free(other);
	crypto_key_free(k2);
	snap_sealer_free(sealer);
	free(bad);
	free(map);
	free(want);
	free(got);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_nonce_unique, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_layer_overflow_rejected, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_aad_binding, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_swap_pages, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_tamper, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_blob, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_key_import_and_lock, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_salt_separates_layers, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_sealed_overlay, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
