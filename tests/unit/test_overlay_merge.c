/* Unit tests of merging an overlay chain's frozen layers: plain and sealed, and what is refused. */
#include <dirent.h>
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
#include "devices/overlay.h"
#include "devices/overlay_merge.h"
#include "snapshot/crypto.h"
#include "snapshot/snap_crypt.h"

#define CHUNK	  (64u << 10)
#define NCHUNKS	  12
#define DISK_SIZE (NCHUNKS * CHUNK - 4096) /* a short last chunk */
#define SECRET	  "merge-secret-7f3a9c"

struct fx {
	char dir[64];
	char base[128];
	uint8_t *want; /* what the disk must read as */
	struct snap_key *key;
	struct crypto_ctx *cc;
	struct snap_sealer *sealer;
};

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	snprintf(f->dir, sizeof(f->dir), "/tmp/cove-merge-XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	snprintf(f->base, sizeof(f->base), "%s/base.img", f->dir);
	f->want = malloc(DISK_SIZE);
	for (uint64_t i = 0; i < DISK_SIZE; i++)
		f->want[i] = (uint8_t)(i * 7 + 3);
	write_file(f->base, f->want, DISK_SIZE);
	assert_int_equal(crypto_key_generate(&f->key), 0);
	assert_int_equal(crypto_ctx_new(f->key, &f->cc), 0);
	struct snap_crypt sc = {.key = f->key, .cc = f->cc};
	crypto_random(sc.chain_id, sizeof(sc.chain_id));
	assert_int_equal(snap_sealer_new(&sc, &f->sealer), 0);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;
	char p[400];
	DIR *d = opendir(f->dir);
	assert_non_null(d);
	struct dirent *e;
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
			snprintf(p, sizeof(p), "%s/%s", f->dir, e->d_name);
			unlink(p);
		}
	closedir(d);
	assert_int_equal(rmdir(f->dir), 0);
	snap_sealer_free(f->sealer);
	crypto_ctx_free(f->cc);
	crypto_key_free(f->key);
	free(f->want);
	free(f);
	return 0;
}

static void path_in(const struct fx *f, char *buf, size_t len, const char *name)
{
	snprintf(buf, len, "%s/%s", f->dir, name);
}

static void do_write(struct fx *f, struct overlay *ov, uint64_t off, uint64_t len, uint8_t seed)
{
	uint8_t *buf = malloc(len);
	for (uint64_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(seed + i * 13);
	if (seed == 0x5e && len >= sizeof(SECRET))
		memcpy(buf, SECRET, sizeof(SECRET));
	struct iovec iov = {buf, len};
	assert_int_equal(overlay_write(ov, off, &iov, 1, len), 0);
	memcpy(f->want + off, buf, len);
	free(buf);
}

static void zero_chunk(struct fx *f, struct overlay *ov, uint64_t c)
{
	assert_int_equal(overlay_write_zeroes(ov, c * CHUNK, CHUNK, true), 0);
	memset(f->want + c * CHUNK, 0, CHUNK);
}

/* The whole disk as the overlay reads it, compared with what it must read. */
static void check_all(const struct fx *f, struct overlay *ov)
{
	uint8_t *buf = malloc(DISK_SIZE);
	memset(buf, 0xee, DISK_SIZE);
	struct iovec iov[2] = {{buf, 5000}, {buf + 5000, DISK_SIZE - 5000}};
	assert_int_equal(overlay_read(ov, 0, iov, 2, DISK_SIZE), 0);
	assert_memory_equal(buf, f->want, DISK_SIZE);
	free(buf);
}

/* True when [off, off + len) of the file is one hole. */
static bool is_hole(const char *path, off_t off, off_t len)
{
	int fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	off_t d = lseek(fd, off, SEEK_DATA);
	close(fd);
	return d < 0 || d >= off + len;
}

/*
 * Four frozen layers written over each other (newest chunk wins), a chunk zeroed by unmap in
 * one of them (a hole whose bit hides the base), chunks never written (read from the base).
 * `sealed`: each layer sealed as it freezes. Leaves the top open at "top4".
 */
static void make_chain(struct fx *f, struct overlay *ov, bool sealed)
{
	char err[512], p[160], name[32];
	path_in(f, p, sizeof(p), "top0");
	assert_int_equal(overlay_open(ov, f->base, p, CHUNK, err, sizeof(err)), 0);
	for (int g = 0; g < 4; g++) {
		/* chunk 0 in every layer: the newest wins; chunk g+1 once each; 6 twice */
		do_write(f, ov, 100 + (uint64_t)g * 10, 3000, (uint8_t)(0x10 + g));
		do_write(f, ov, (uint64_t)(g + 1) * CHUNK, CHUNK, (uint8_t)(0x20 + g));
		if (g == 1 || g == 3)
			do_write(f, ov, 6 * CHUNK + 512 * (uint64_t)g, 700, 0x5e);
		if (g == 2) {
			zero_chunk(f, ov, 8);
			zero_chunk(f, ov, 2); /* over layer 1's data: zeros win */
		}
		if (g == 3)
			do_write(f, ov, (NCHUNKS - 1) * (uint64_t)CHUNK + 10, 100, 0x33);
		if (sealed) {
			ov->sealer = &f->sealer->ops;
			ov->seal_layer_id = (uint64_t)g + 1;
		}
		snprintf(name, sizeof(name), "top%d", g + 1);
		path_in(f, p, sizeof(p), name);
		assert_int_equal(overlay_freeze(ov, p, err, sizeof(err)), 0);
		check_all(f, ov);
	}
	assert_int_equal(ov->nr_layers, 4);
	assert_int_equal(ov->depth, 4);
}

static void test_merge_plain(void **state)
{
	struct fx *f = *state;
	struct overlay ov;
	struct overlay_merged m;
	char err[512], mpath[160], mmap[170], p[160];
	make_chain(f, &ov, false);
	do_write(f, &ov, 3 * CHUNK + 77, 99, 0x44); /* the top's own data stays on top */
	path_in(f, mpath, sizeof(mpath), "merged");
	snprintf(mmap, sizeof(mmap), "%s.map", mpath);
	assert_int_equal(overlay_merge_build(&ov, mpath, NULL, 0, &m, err, sizeof(err)), 0);
	/* chunks 0..4, 2 (zeroed), 6, 8 (zeroed), the last: 0,1,2,3,4,6,8,11 */
	assert_int_equal(m.chunks, 8);
	assert_int_equal(m.nr_src, 4);
	check_all(f, &ov); /* building changes nothing the guest reads */

	/* Its map: frozen, depth 0, no parent, the union of the bitmaps. */
	size_t len;
	uint8_t *mb = read_file(mmap, &len);
	struct overlay_map_info info;
	assert_int_equal(overlay_map_parse(mb, len, &info, err, sizeof(err)), 0);
	assert_int_equal(info.version, OVERLAY_MAP_VERSION);
	assert_int_equal(info.flags, OVERLAY_MAP_FROZEN);
	assert_int_equal(info.depth, 0);
	assert_int_equal(info.parent_crc, 0);
	assert_int_equal(info.bitmap[0], 0x5f); /* 0,1,2,3,4,6 */
	assert_int_equal(info.bitmap[1], 0x09); /* 8, 11 */
	free(mb);
	/* Holes stay holes: chunks no layer holds, and the zeroed ones. */
	assert_true(is_hole(mpath, 5 * CHUNK, CHUNK));
	assert_true(is_hole(mpath, 7 * CHUNK, CHUNK));
	assert_true(is_hole(mpath, 2 * CHUNK, CHUNK));
	assert_true(is_hole(mpath, 8 * CHUNK, CHUNK));
	assert_false(is_hole(mpath, 1 * CHUNK, CHUNK));

	assert_int_equal(overlay_merge_install(&ov, &m, err, sizeof(err)), 0);
	assert_int_equal(m.layer.data_fd, -1);
	assert_int_equal(ov.nr_layers, 1);
	assert_int_equal(ov.depth, 1);
	check_all(f, &ov);
	/* A second install of the emptied merge is refused. */
	assert_int_equal(overlay_merge_install(&ov, &m, err, sizeof(err)), -ESTALE);
	/* Copy-up from the merged layer, then the chain goes on growing on it. */
	do_write(f, &ov, 4 * CHUNK + 5, 10, 0x55);
	path_in(f, p, sizeof(p), "top5");
	assert_int_equal(overlay_freeze(&ov, p, err, sizeof(err)), 0);
	do_write(f, &ov, 9 * CHUNK, 10, 0x66);
	check_all(f, &ov);
	assert_int_equal(overlay_close(&ov), 0);

	/* Opened later: [merged, top4 (frozen on it), top5] reads the same. */
	char l1[160], top[160];
	path_in(f, l1, sizeof(l1), "top4");
	path_in(f, top, sizeof(top), "top5");
	const char *chain[3] = {mpath, l1, top};
	assert_int_equal(overlay_open_chain(&ov, f->base, chain, 3, 0, err, sizeof(err)), 0);
	check_all(f, &ov);
	assert_int_equal(overlay_close(&ov), 0);
}

/* After a merge a chain that is not the merged one is refused, naming the map. */
static void test_merge_refused(void **state)
{
	struct fx *f = *state;
	struct overlay ov;
	struct overlay_merged m;
	char err[512], mpath[160], mmap[170], p[4][160], top[160];
	make_chain(f, &ov, false);
	path_in(f, mpath, sizeof(mpath), "merged");
	snprintf(mmap, sizeof(mmap), "%s.map", mpath);
	/* A merge built, then the chain grows: it no longer fits and changes nothing. */
	assert_int_equal(overlay_merge_build(&ov, mpath, NULL, 0, &m, err, sizeof(err)), 0);
	do_write(f, &ov, 0, 10, 0x71);
	path_in(f, top, sizeof(top), "top5");
	assert_int_equal(overlay_freeze(&ov, top, err, sizeof(err)), 0);
	assert_int_equal(overlay_merge_install(&ov, &m, err, sizeof(err)), -ESTALE);
	assert_int_equal(ov.nr_layers, 5);
	check_all(f, &ov);
	overlay_merged_free(&m);
	/* Sealed layers never merge into a plain one. */
	ov.layers[2].sealed = true;
	assert_int_equal(overlay_merge_build(&ov, mpath, NULL, 0, &m, err, sizeof(err)), -EACCES);
	ov.layers[2].sealed = false;
	path_in(f, mpath, sizeof(mpath), "merged2");
	snprintf(mmap, sizeof(mmap), "%s.map", mpath);
	assert_int_equal(overlay_merge_build(&ov, mpath, NULL, 0, &m, err, sizeof(err)), 0);
	/* Its name is taken now: building there again never replaces it. */
	struct overlay_merged m2;
	assert_int_equal(overlay_merge_build(&ov, mpath, NULL, 0, &m2, err, sizeof(err)), -EEXIST);
	assert_int_equal(overlay_merge_install(&ov, &m, err, sizeof(err)), 0);
	char top6[160];
	path_in(f, top6, sizeof(top6), "top6");
	assert_int_equal(overlay_freeze(&ov, top6, err, sizeof(err)), 0);
	assert_int_equal(overlay_close(&ov), 0);

	const char *good[3] = {mpath, top, top6};
	assert_int_equal(overlay_open_chain(&ov, f->base, good, 3, 0, err, sizeof(err)), 0);
	check_all(f, &ov);
	assert_int_equal(overlay_close(&ov), 0);
	/* The old layers in the merged one's place: top5 names the merged map as its parent. */
	char p4[160];
	for (int i = 0; i < 4; i++) {
		char n[16];
		snprintf(n, sizeof(n), "top%d", i);
		path_in(f, p[i], sizeof(p[i]), n);
	}
	path_in(f, p4, sizeof(p4), "top4");
	const char *old[7] = {p[0], p[1], p[2], p[3], p4, top, top6};
	assert_int_equal(overlay_open_chain(&ov, f->base, old, 7, 0, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "top5.map is layer 1"));
	/* The merged layer left out, or given twice. */
	const char *skip[2] = {top, top6};
	assert_int_equal(overlay_open_chain(&ov, f->base, skip, 2, 0, err, sizeof(err)), -EINVAL);
	const char *twice[4] = {mpath, mpath, top, top6};
	assert_int_equal(overlay_open_chain(&ov, f->base, twice, 4, 0, err, sizeof(err)), -EINVAL);
	/* The merged map modified (a chunk dropped, both its CRCs made right again): refused. */
	size_t len;
	uint8_t *mb = read_file(mmap, &len);
	mb[OVERLAY_MAP_HDR_SIZE] &= (uint8_t)~1u;
	put_le32(mb + 32, crc32_update(0, mb + OVERLAY_MAP_HDR_SIZE, len - OVERLAY_MAP_HDR_SIZE));
	put_le32(mb + 48, crc32_update(0, mb, 48));
	unlink(mmap);
	write_file(mmap, mb, len);
	free(mb);
	assert_int_equal(overlay_open_chain(&ov, f->base, good, 3, 0, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "another parent layer"));
	/* ... and a corrupt one is refused by its own checks. */
	mb = read_file(mmap, &len);
	mb[OVERLAY_MAP_HDR_SIZE] ^= 0x80;
	unlink(mmap);
	write_file(mmap, mb, len);
	free(mb);
	assert_int_equal(overlay_open_chain(&ov, f->base, good, 3, 0, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "checksum mismatch"));
}

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

static void test_merge_sealed(void **state)
{
	struct fx *f = *state;
	struct overlay ov;
	struct overlay_merged m;
	char err[512], mpath[160], mmap[170], top5[160], l4[160];
	make_chain(f, &ov, true);
	for (int i = 0; i < ov.nr_layers; i++)
		assert_true(ov.layers[i].sealed);
	path_in(f, mpath, sizeof(mpath), "merged-sealed");
	snprintf(mmap, sizeof(mmap), "%s.map", mpath);
	/* Without the chain's key sealed layers do not merge. */
	assert_int_equal(overlay_merge_build(&ov, mpath, NULL, 0, &m, err, sizeof(err)), -EACCES);
	assert_int_equal(overlay_merge_build(&ov, mpath, &f->sealer->ops, 5, &m, err, sizeof(err)),
			 0);
	assert_int_equal(m.chunks, 8);
	assert_true(m.layer.sealed);
	/* Ciphertext only: the secret written in clear into two layers is nowhere in it. */
	assert_false(file_holds(mpath, SECRET));
	assert_false(file_holds(mmap, SECRET));
	size_t len;
	uint8_t *mb = read_file(mmap, &len);
	struct overlay_map_info info;
	assert_int_equal(overlay_map_parse(mb, len, &info, err, sizeof(err)), 0);
	assert_int_equal(info.version, OVERLAY_MAP_VERSION_SEALED);
	assert_int_equal(info.depth, 0);
	assert_int_equal(info.layer_id, 5);
	free(mb);
	struct stat st;
	assert_int_equal(stat(mpath, &st), 0);
	assert_int_equal(st.st_size, DISK_SIZE + NCHUNKS * OVERLAY_TAG_LEN);
	assert_true(is_hole(mpath, 5 * CHUNK, CHUNK)); /* never written: no ciphertext either */

	assert_int_equal(overlay_merge_install(&ov, &m, err, sizeof(err)), 0);
	check_all(f, &ov);
	do_write(f, &ov, 7 * CHUNK + 3, 50, 0x5e);
	ov.seal_layer_id = 6;
	path_in(f, top5, sizeof(top5), "top5");
	assert_int_equal(overlay_freeze(&ov, top5, err, sizeof(err)), 0);
	assert_int_equal(overlay_layer_path(&ov, 1, l4, sizeof(l4)), 0);
	check_all(f, &ov);
	assert_int_equal(overlay_close(&ov), 0);

	/* Restored: authenticated with the chain's sealer, every chunk checked, same bytes. */
	const char *chain[3] = {mpath, l4, top5};
	assert_int_equal(overlay_open_chain(&ov, f->base, chain, 3, 0, err, sizeof(err)), 0);
	assert_int_equal(overlay_attach_sealer(&ov, &f->sealer->ops, err, sizeof(err)), 0);
	assert_int_equal(overlay_verify_sealed(&ov, err, sizeof(err)), 0);
	check_all(f, &ov);
	assert_int_equal(overlay_close(&ov), 0);

	/* Another chain's key does not authenticate the merged map. */
	struct snap_key *k2;
	struct crypto_ctx *cc2;
	struct snap_sealer *other;
	assert_int_equal(crypto_key_generate(&k2), 0);
	assert_int_equal(crypto_ctx_new(k2, &cc2), 0);
	struct snap_crypt sc2 = {.key = k2, .cc = cc2};
	memcpy(sc2.chain_id, f->sealer->chain_id, sizeof(sc2.chain_id));
	assert_int_equal(snap_sealer_new(&sc2, &other), 0);
	assert_int_equal(overlay_open_chain(&ov, f->base, chain, 3, 0, err, sizeof(err)), 0);
	assert_int_equal(overlay_attach_sealer(&ov, &other->ops, err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "merged-sealed.map failed authentication"));
	assert_int_equal(overlay_close(&ov), 0);
	snap_sealer_free(other);
	crypto_ctx_free(cc2);
	crypto_key_free(k2);

	/* A byte of a merged chunk altered: that chunk is refused, never handed over. */
	flip(mpath, 1 * CHUNK + 10);
	assert_int_equal(overlay_open_chain(&ov, f->base, chain, 3, 0, err, sizeof(err)), 0);
	assert_int_equal(overlay_attach_sealer(&ov, &f->sealer->ops, err, sizeof(err)), 0);
	assert_int_equal(overlay_verify_sealed(&ov, err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "chunk 1 failed authentication"));
	uint8_t b[16];
	struct iovec iov = {b, sizeof(b)};
	assert_int_equal(overlay_read(&ov, 1 * CHUNK, &iov, 1, sizeof(b)), -EBADMSG);
	assert_int_equal(overlay_close(&ov), 0);
	flip(mpath, 1 * CHUNK + 10);
	/*
	 * Its map's layer id altered, its header CRC made right. The parent CRC the next layer
	 * records does not see it (a CRC-32 over bytes that end in their own CRC is a constant,
	 * so a map's whole-file CRC depends on its bitmap only: OVERLAY.md); the sealed digest
	 * does, and the chain is refused before anything is read.
	 */
	mb = read_file(mmap, &len);
	mb[48] ^= 1;
	put_le32(mb + OVERLAY_MAP_HDR_SEALED - 4, crc32_update(0, mb, OVERLAY_MAP_HDR_SEALED - 4));
	unlink(mmap);
	write_file(mmap, mb, len);
	free(mb);
	assert_int_equal(overlay_open_chain(&ov, f->base, chain, 3, 0, err, sizeof(err)), 0);
	assert_int_equal(overlay_attach_sealer(&ov, &f->sealer->ops, err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "merged-sealed.map failed authentication"));
	assert_int_equal(overlay_read(&ov, 1 * CHUNK, &iov, 1, sizeof(b)), -EACCES);
	assert_int_equal(overlay_close(&ov), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_merge_plain, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_merge_refused, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_merge_sealed, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
