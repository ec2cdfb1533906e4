/* Test helper: a small snapshot chain, plain or sealed, written to a directory without a VM. */
#ifndef COVE_TEST_CHAIN_FIXTURE_H
#define COVE_TEST_CHAIN_FIXTURE_H

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "snapshot/chain.h"
#include "snapshot/mem_layer.h"
#include "snapshot/snap_crypt.h"
#include "snapshot/state_file.h"
#include "common/crc32.h"

#define FX_PAGES 16 /* RAM of the fixture chain: 16 pages */

/* The byte that fills page p after layer k (0: the base, which holds every page). */
static inline uint8_t fx_page_byte(int k, uint64_t p)
{
	return k == 0 ? (uint8_t)(p + 1) : (uint8_t)(0x80 + k);
}

/* Layer k > 0 holds pages k and k + 8. */
static inline bool fx_holds(int k, uint64_t p)
{
	return k == 0 || p == (uint64_t)k || p == (uint64_t)k + 8;
}

/* What RAM page p holds after layers 0..upto. */
static inline uint8_t fx_expect(int upto, uint64_t p)
{
	uint8_t v = fx_page_byte(0, p);
	for (int k = 1; k <= upto; k++)
		if (fx_holds(k, p))
			v = fx_page_byte(k, p);
	return v;
}

static inline void fx_write(const char *path, const void *buf, size_t len, off_t off, bool create)
{
	int fd = open(path, O_WRONLY | (create ? O_CREAT | O_TRUNC : 0), 0600);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, buf, len, off), (ssize_t)len);
	close(fd);
}

/*
 * Writes memory layer k of chain `c` as DIR/mem-k with the given parent id; with `sc`, sealed as
 * snapshot.c seals it (fresh salt, AES-GCM pages and tags, data bitmap, sealed digest).
 */
static inline void fx_write_layer_sealed(const struct chain *c, int k, uint64_t parent,
					 struct snap_crypt *sc)
{
	struct mem_layer_info li;
	memset(&li, 0, sizeof(li));
	li.flags = (k == 0 ? MEM_LAYER_FULL : 0) | (sc ? MEM_LAYER_ENCRYPTED : 0);
	mem_layer_layout(&li, FX_PAGES * MEM_LAYER_PAGE);
	li.layer_id = c->layers[k].id;
	li.parent_id = parent;
	memcpy(li.chain_id, c->chain_id, 16);
	/* The held-pages bitmap, then (sealed) the pages-with-data bitmap right after it. */
	size_t bms = (size_t)li.bitmap_len * (sc ? 2 : 1);
	uint8_t *bm = calloc(1, bms);
	assert_non_null(bm);
	if (sc)
		assert_int_equal(snap_crypt_new_layer(sc, li.layer_id, li.salt), 0);
	char path[4200];
	snprintf(path, sizeof(path), "%s/%s", c->dir, c->layers[k].mem);
	uint8_t page[MEM_LAYER_PAGE];
	uint8_t tag[CRYPTO_TAG_LEN];
	uint8_t hdr[MEM_LAYER_HDR] = {0};
	fx_write(path, hdr, sizeof(hdr), 0, true);
	for (uint64_t p = 0; p < FX_PAGES; p++) {
		if (!fx_holds(k, p))
			continue;
		bm[p / 8] |= (uint8_t)(1u << (p % 8));
		if (sc)
			bm[li.bitmap_len + p / 8] |= (uint8_t)(1u << (p % 8));
		li.present++;
		li.stored++;
		memset(page, fx_page_byte(k, p), sizeof(page));
		if (sc) {
			assert_int_equal(crypto_seal_page(sc->cc, c->chain_id, li.layer_id, p, page,
							  sizeof(page), page, tag),
					 0);
			fx_write(path, tag, sizeof(tag), (off_t)(li.tag_off + p * sizeof(tag)),
				 false);
		}
		fx_write(path, page, sizeof(page), (off_t)(li.data_off + p * MEM_LAYER_PAGE),
			 false);
	}
	li.bitmap_crc = crc32_update(0, bm, bms);
	mem_layer_header_build(&li, hdr);
	if (sc) {
		/* The digest covers the header with its salt; the sealed result joins it. */
		assert_int_equal(snap_crypt_seal_meta(sc, hdr, bm, bms, li.meta), 0);
		mem_layer_header_build(&li, hdr);
	}
	fx_write(path, hdr, sizeof(hdr), 0, false);
	fx_write(path, bm, bms, (off_t)li.bitmap_off, false);
	assert_int_equal(truncate(path, (off_t)mem_layer_file_size(&li)), 0);
	free(bm);
}

/* Writes plain memory layer k of chain `c` as DIR/mem-k with the given parent id. */
static inline void fx_write_layer(const struct chain *c, int k, uint64_t parent)
{
	fx_write_layer_sealed(c, k, parent, NULL);
}

/* Writes DIR/state-k: a machine description section (unless `no_config`) and one more. */
static inline void fx_write_state(const struct chain *c, int k, bool no_config)
{
	struct state_buf b;
	state_buf_init(&b);
	static const char cfg[] = "{\"fixture\":true}";
	if (!no_config)
		state_put(&b, SEC_CONFIG, 0, cfg, sizeof(cfg) - 1);
	uint64_t v = (uint64_t)k;
	state_put(&b, SEC_CONFIG + 1, 0, &v, sizeof(v));
	assert_int_equal(state_finish(&b), 0);
	char path[4200];
	snprintf(path, sizeof(path), "%s/%s", c->dir, c->layers[k].state);
	fx_write(path, b.p, b.len, 0, true);
	state_buf_free(&b);
}

/*
 * A chain of n layers (ids 1..n) in `dir`: every file written and chain.json committed. With
 * `sc`, the memory layers are sealed under its key and the chain takes its chain id (the state
 * files stay plain: restore's state side is not what the sealed fixture is for).
 */
static inline void fx_make_chain_sealed(struct chain *c, const char *dir, int n,
					struct snap_crypt *sc)
{
	memset(c, 0, sizeof(*c));
	snprintf(c->dir, sizeof(c->dir), "%s", dir);
	for (int i = 0; i < 16; i++)
		c->chain_id[i] = sc ? sc->chain_id[i] : (uint8_t)(i * 7 + 3);
	c->ram_size = FX_PAGES * MEM_LAYER_PAGE;
	c->nr_layers = n;
	for (int k = 0; k < n; k++) {
		struct chain_layer *l = &c->layers[k];
		l->id = (uint64_t)k + 1;
		l->parent = k ? (uint64_t)k : 0;
		l->full = k == 0;
		snprintf(l->mem, sizeof(l->mem), "mem-%d", k);
		snprintf(l->state, sizeof(l->state), "state-%d", k);
		l->created_ns = 1700000000000000000ULL + (uint64_t)k;
		fx_write_layer_sealed(c, k, l->parent, sc);
		fx_write_state(c, k, false);
		l->present = k == 0 ? FX_PAGES : 2;
		l->stored = l->present;
	}
	char err[512];
	assert_int_equal(chain_commit(c, err, sizeof(err)), 0);
}

static inline void fx_make_chain(struct chain *c, const char *dir, int n)
{
	fx_make_chain_sealed(c, dir, n, NULL);
}

static inline void fx_mkdtemp(char *dir, size_t len, const char *name)
{
	snprintf(dir, len, "/tmp/cove-%s-XXXXXX", name);
	assert_non_null(mkdtemp(dir));
}

/* Removes every plain file in the directory, then the directory. */
static inline void fx_rmdir(const char *dir)
{
	DIR *d = opendir(dir);
	if (d) {
		struct dirent *e;
		char p[4400];
		while ((e = readdir(d)))
			if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
				snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
				unlink(p);
			}
		closedir(d);
	}
	rmdir(dir);
}

/* A test's fixture: a 3-layer chain in a fresh directory (cmocka state). */
struct chain_fx {
	char dir[64];
	struct chain c;
};

static inline int fx_setup(void **state, const char *name)
{
	struct chain_fx *f = calloc(1, sizeof(*f));
	if (!f)
		return -1;
	fx_mkdtemp(f->dir, sizeof(f->dir), name);
	fx_make_chain(&f->c, f->dir, 3);
	*state = f;
	return 0;
}

static inline int fx_teardown(void **state)
{
	struct chain_fx *f = *state;
	fx_rmdir(f->dir);
	free(f);
	return 0;
}

#endif
