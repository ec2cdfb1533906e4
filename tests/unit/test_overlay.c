/* Unit tests of the copy-on-write overlay: copy-up, mixed reads, map persistence, bad map files. */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
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

#include "common/crc32.h"
#include "devices/blk_uring.h"
#include "devices/overlay.h"

#define CHUNK	  (64u << 10)
#define DISK_SIZE (4 * CHUNK + 12288) /* a short last chunk */

struct fx {
	char dir[64];
	char base[128];
	char ovl[128];
	char map[140];
	uint8_t *want; /* what the disk should read as */
};

static uint8_t base_byte(uint64_t off)
{
	return (uint8_t)(off * 7 + 3);
}

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	snprintf(f->dir, sizeof(f->dir), "/tmp/cove-ovl-XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	snprintf(f->base, sizeof(f->base), "%s/base.img", f->dir);
	snprintf(f->ovl, sizeof(f->ovl), "%s/ovl", f->dir);
	snprintf(f->map, sizeof(f->map), "%s/ovl.map", f->dir);
	f->want = malloc(DISK_SIZE);
	for (uint64_t i = 0; i < DISK_SIZE; i++)
		f->want[i] = base_byte(i);
	write_file(f->base, f->want, DISK_SIZE);
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
	free(f->want);
	free(f);
	return 0;
}

static void do_write(struct fx *f, struct overlay *ov, uint64_t off, uint64_t len, uint8_t seed)
{
	uint8_t *buf = malloc(len);
	for (uint64_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(seed + i * 13);
	/* Split in two iovecs to exercise the cursor. */
	struct iovec iov[2] = {{buf, len / 3}, {buf + len / 3, len - len / 3}};
	assert_int_equal(overlay_write(ov, off, iov, 2, len), 0);
	memcpy(f->want + off, buf, len);
	free(buf);
}

static void check_all(struct fx *f, struct overlay *ov)
{
	uint8_t *buf = malloc(DISK_SIZE);
	memset(buf, 0xee, DISK_SIZE);
	/* Odd-sized iovecs spanning chunk boundaries. */
	struct iovec iov[3] = {{buf, 1000},
			       {buf + 1000, CHUNK + 5},
			       {buf + 1000 + CHUNK + 5, DISK_SIZE - 1000 - CHUNK - 5}};
	assert_int_equal(overlay_read(ov, 0, iov, 3, DISK_SIZE), 0);
	assert_memory_equal(buf, f->want, DISK_SIZE);
	/* A small read across the boundary of chunk 0 and 1. */
	struct iovec one = {buf, 8192};
	assert_int_equal(overlay_read(ov, CHUNK - 4096, &one, 1, 8192), 0);
	assert_memory_equal(buf, f->want + CHUNK - 4096, 8192);
	free(buf);
}

static void test_copy_up_and_reads(void **state)
{
	struct fx *f = *state;
	struct overlay ov;
	char err[256];
	assert_int_equal(overlay_open(&ov, f->base, f->ovl, CHUNK, err, sizeof(err)), 0);
	assert_int_equal(ov.nr_chunks, 5);
	assert_int_equal(access(f->map, F_OK), 0);
	check_all(f, &ov);

	do_write(f, &ov, 0, 512, 1);		     /* start of chunk 0 */
	do_write(f, &ov, 2 * CHUNK + 4096, 4096, 2); /* middle of chunk 2 */
	do_write(f, &ov, 4 * CHUNK - 512, 512, 3);   /* end of chunk 3 */
	do_write(f, &ov, 4 * CHUNK + 4096, 8192, 4); /* end of the short last chunk */
	assert_int_equal(ov.copy_ups, 4);
	assert_true(overlay_chunk_allocated(&ov, 0));
	assert_false(overlay_chunk_allocated(&ov, 1));
	assert_true(overlay_chunk_allocated(&ov, 2));
	assert_true(overlay_chunk_allocated(&ov, 3));
	assert_true(overlay_chunk_allocated(&ov, 4));
	check_all(f, &ov);

	/* Whole chunk: no copy-up; then a write spanning chunks 0 (allocated) and 1 (now too). */
	do_write(f, &ov, CHUNK, CHUNK, 5);
	assert_int_equal(ov.copy_ups, 4);
	do_write(f, &ov, CHUNK - 100, 300, 6);
	assert_int_equal(ov.copy_ups, 4);
	check_all(f, &ov);

	/* Out of range. */
	uint8_t b[512];
	struct iovec iov = {b, sizeof(b)};
	assert_int_equal(overlay_read(&ov, DISK_SIZE - 256, &iov, 1, 512), -EINVAL);
	assert_int_equal(overlay_write(&ov, DISK_SIZE, &iov, 1, 512), -EINVAL);
	assert_int_equal(overlay_close(&ov), 0);

	/* The base was never written. */
	size_t len;
	uint8_t *base = read_file(f->base, &len);
	assert_int_equal(len, DISK_SIZE);
	for (size_t i = 0; i < len; i++)
		assert_int_equal(base[i], base_byte(i));
	free(base);
}

static void test_persist_and_reload(void **state)
{
	struct fx *f = *state;
	struct overlay ov;
	char err[256];
	assert_int_equal(overlay_open(&ov, f->base, f->ovl, CHUNK, err, sizeof(err)), 0);
	do_write(f, &ov, 3 * CHUNK + 77 * 512, 1024, 9);
	assert_true(ov.map_dirty);
	assert_int_equal(overlay_flush(&ov), 0);
	assert_false(ov.map_dirty);
	/* Simulate a crash: written after the flush, never flushed, the map on disk lacks it. */
	do_write(f, &ov, 1 * CHUNK + 512, 512, 10);
	size_t len;
	uint8_t *map = read_file(f->map, &len);
	struct overlay_map_info info;
	assert_int_equal(overlay_map_parse(map, len, &info, err, sizeof(err)), 0);
	assert_int_equal(info.bitmap[0], 1u << 3);
	free(map);
	close(ov.data_fd); /* no final flush */
	close(ov.base_fd);
	ov.data_fd = ov.base_fd = -1;
	overlay_close(&ov);
	/* The unflushed chunk reads as base again, the flushed one survives. */
	for (uint64_t i = CHUNK + 512; i < CHUNK + 1024; i++)
		f->want[i] = base_byte(i);
	assert_int_equal(overlay_open(&ov, f->base, f->ovl, 0, err, sizeof(err)), 0);
	assert_int_equal(ov.chunk_size, CHUNK);
	assert_true(overlay_chunk_allocated(&ov, 3));
	assert_false(overlay_chunk_allocated(&ov, 1));
	check_all(f, &ov);
	/* A clean close saves the map without an explicit flush. */
	do_write(f, &ov, 0, 4096, 11);
	assert_int_equal(overlay_close(&ov), 0);
	assert_int_equal(overlay_open(&ov, f->base, f->ovl, 0, err, sizeof(err)), 0);
	assert_true(overlay_chunk_allocated(&ov, 0));
	check_all(f, &ov);
	assert_int_equal(overlay_close(&ov), 0);
}

/* Opens with the map file replaced by `buf`; returns the result and leaves the message in err. */
static int open_with_map(struct fx *f, const uint8_t *buf, size_t len, char *err, size_t errlen)
{
	write_file(f->map, buf, len);
	struct overlay ov;
	int r = overlay_open(&ov, f->base, f->ovl, 0, err, errlen);
	if (r == 0)
		overlay_close(&ov);
	return r;
}

static void test_bad_maps(void **state)
{
	struct fx *f = *state;
	struct overlay ov;
	char err[512];
	assert_int_equal(overlay_open(&ov, f->base, f->ovl, CHUNK, err, sizeof(err)), 0);
	do_write(f, &ov, 0, 512, 1);
	assert_int_equal(overlay_close(&ov), 0);
	size_t len;
	uint8_t *good = read_file(f->map, &len);
	uint8_t *bad = malloc(len + 16);
	assert_int_equal(len, OVERLAY_MAP_HDR_SIZE + 1);

	assert_int_equal(open_with_map(f, good, len, err, sizeof(err)), 0);

	assert_int_equal(open_with_map(f, good, 10, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "truncated"));
	assert_non_null(strstr(err, f->map));
	assert_int_equal(open_with_map(f, good, len - 1, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "truncated"));
	assert_int_equal(open_with_map(f, good, 0, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "truncated"));

	memcpy(bad, good, len);
	bad[len] = 0;
	assert_int_equal(open_with_map(f, bad, len + 1, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "trailing"));

	memcpy(bad, good, len);
	bad[0] = 'X';
	assert_int_equal(open_with_map(f, bad, len, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "magic"));

	memcpy(bad, good, len);
	bad[8] = 4; /* version */
	assert_int_equal(open_with_map(f, bad, len, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "unsupported version 4"));

	memcpy(bad, good, len);
	bad[20] ^= 1; /* disk size, header CRC not updated */
	assert_int_equal(open_with_map(f, bad, len, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "header checksum"));

	memcpy(bad, good, len);
	bad[OVERLAY_MAP_HDR_SIZE] |= 2; /* bitmap flip */
	assert_int_equal(open_with_map(f, bad, len, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "bitmap checksum"));

	/* Well-formed but hostile headers, with valid CRCs. */
	struct overlay fake = {.chunk_size = CHUNK,
			       .disk_size = DISK_SIZE,
			       .nr_chunks = 5,
			       .bitmap = (uint8_t[1]){0xe0},
			       .bitmap_bytes = 1};
	uint8_t *mb;
	size_t mlen;
	assert_int_equal(overlay_map_build(&fake, &mb, &mlen), 0);
	assert_int_equal(open_with_map(f, mb, mlen, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "past the last chunk"));
	free(mb);
	fake.bitmap = (uint8_t[1]){0};
	fake.chunk_size = 1000;
	assert_int_equal(overlay_map_build(&fake, &mb, &mlen), 0);
	assert_int_equal(open_with_map(f, mb, mlen, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "chunk size"));
	free(mb);
	fake.chunk_size = CHUNK;
	fake.nr_chunks = 6;
	assert_int_equal(overlay_map_build(&fake, &mb, &mlen), 0);
	assert_int_equal(open_with_map(f, mb, mlen, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "chunk count"));
	free(mb);
	/* A huge claimed disk: the bitmap cap refuses it before anything is allocated. */
	fake.chunk_size = OVERLAY_CHUNK_MIN;
	fake.disk_size = OVERLAY_DISK_MAX;
	fake.nr_chunks = OVERLAY_DISK_MAX / OVERLAY_CHUNK_MIN;
	assert_int_equal(overlay_map_build(&fake, &mb, &mlen), 0);
	assert_int_equal(open_with_map(f, mb, mlen, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "cap"));
	free(mb);
	/* A map for another disk size. */
	fake.chunk_size = CHUNK;
	fake.disk_size = 5 * CHUNK;
	fake.nr_chunks = 5;
	assert_int_equal(overlay_map_build(&fake, &mb, &mlen), 0);
	assert_int_equal(open_with_map(f, mb, mlen, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "was made for a 327680-byte disk"));
	free(mb);

	/* Map present, data file gone. */
	write_file(f->map, good, len);
	unlink(f->ovl);
	assert_int_equal(overlay_open(&ov, f->base, f->ovl, 0, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "its map exists"));
	free(bad);
	free(good);
}

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* A version 1 map (40-byte header, no chain fields) is still read as a single layer. */
static void test_v1_map(void **state)
{
	struct fx *f = *state;
	char err[256];
	uint8_t m[OVERLAY_MAP_HDR_V1 + 1] = "COVEOVLM";
	put32(m + 8, 1);
	put32(m + 12, CHUNK);
	put32(m + 16, DISK_SIZE);
	put32(m + 24, 5);
	m[OVERLAY_MAP_HDR_V1] = 1u << 2; /* chunk 2 */
	put32(m + 32, crc32_update(0, m + OVERLAY_MAP_HDR_V1, 1));
	put32(m + 36, crc32_update(0, m, 36));
	write_file(f->map, m, sizeof(m));
	uint8_t *data = calloc(1, DISK_SIZE);
	memset(data + 2 * CHUNK, 0x5a, CHUNK);
	write_file(f->ovl, data, DISK_SIZE);
	free(data);
	memset(f->want + 2 * CHUNK, 0x5a, CHUNK);
	struct overlay ov;
	assert_int_equal(overlay_open(&ov, f->base, f->ovl, 0, err, sizeof(err)), 0);
	assert_true(overlay_chunk_allocated(&ov, 2));
	check_all(f, &ov);
	do_write(f, &ov, 0, 512, 3);
	assert_int_equal(overlay_close(&ov), 0);
	/* Rewritten as version 2. */
	size_t len;
	uint8_t *map = read_file(f->map, &len);
	struct overlay_map_info info;
	assert_int_equal(overlay_map_parse(map, len, &info, err, sizeof(err)), 0);
	assert_int_equal(info.version, 2);
	assert_int_equal(info.bitmap[0], 5);
	free(map);
}

static void path_in(struct fx *f, char *buf, size_t len, const char *name)
{
	snprintf(buf, len, "%s/%s", f->dir, name);
}

static int open_chain(struct fx *f, const char *const *names, int n, char *err, size_t errlen)
{
	char p[OVERLAY_CHAIN_MAX][160];
	const char *paths[OVERLAY_CHAIN_MAX];
	assert_true(n <= OVERLAY_CHAIN_MAX);
	for (int i = 0; i < n; i++) {
		path_in(f, p[i], sizeof(p[i]), names[i]);
		paths[i] = p[i];
	}
	struct overlay ov;
	int r = overlay_open_chain(&ov, f->base, paths, n, 0, err, errlen);
	if (r == 0) {
		check_all(f, &ov);
		overlay_close(&ov);
	}
	return r;
}

static void test_freeze_chain(void **state)
{
	struct fx *f = *state;
	struct overlay ov;
	char err[512], l1[160], l2[160], l2map[160];
	path_in(f, l1, sizeof(l1), "l1");
	path_in(f, l2, sizeof(l2), "l2");
	path_in(f, l2map, sizeof(l2map), "l2.map");
	assert_int_equal(overlay_open(&ov, f->base, f->ovl, CHUNK, err, sizeof(err)), 0);
	do_write(f, &ov, 100, 1000, 1);		   /* chunk 0, copy-up from base */
	do_write(f, &ov, 2 * CHUNK, CHUNK, 2);	   /* chunk 2 whole */
	do_write(f, &ov, 4 * CHUNK + 512, 512, 3); /* short last chunk */
	/* No flush: freezing syncs the data and writes the map itself. */
	assert_int_equal(overlay_freeze(&ov, l1, err, sizeof(err)), 0);
	assert_int_equal(ov.nr_layers, 1);
	assert_int_equal(ov.depth, 1);
	assert_false(overlay_chunk_allocated(&ov, 0));
	check_all(f, &ov);
	size_t d0len, m0len;
	uint8_t *d0 = read_file(f->ovl, &d0len);
	uint8_t *m0 = read_file(f->map, &m0len);
	struct overlay_map_info info;
	assert_int_equal(overlay_map_parse(m0, m0len, &info, err, sizeof(err)), 0);
	assert_int_equal(info.flags, OVERLAY_MAP_FROZEN);
	assert_int_equal(info.depth, 0);
	assert_int_equal(info.bitmap[0], (1u << 0) | (1u << 2) | (1u << 4));

	/* Partial writes copy up from the frozen layer (chunks 0, 2) or the base (chunk 1). */
	uint64_t before = ov.copy_ups;
	do_write(f, &ov, 200, 300, 4);
	do_write(f, &ov, CHUNK + 4096, 512, 5);
	do_write(f, &ov, 2 * CHUNK + CHUNK - 1024, 1024, 6);
	assert_int_equal(ov.copy_ups, before + 3);
	check_all(f, &ov);
	assert_int_equal(overlay_flush(&ov), 0);
	assert_int_equal(overlay_freeze(&ov, l2, err, sizeof(err)), 0);
	assert_int_equal(ov.nr_layers, 2);
	size_t d1len, m1len;
	uint8_t *d1 = read_file(l1, &d1len);
	path_in(f, l1, sizeof(l1), "l1.map");
	uint8_t *m1 = read_file(l1, &m1len);
	path_in(f, l1, sizeof(l1), "l1");
	do_write(f, &ov, 0, 4096, 7);
	do_write(f, &ov, 3 * CHUNK, CHUNK + 12288, 8); /* to the end of the disk */
	check_all(f, &ov);
	/* A second freeze onto an existing map is refused and changes nothing. */
	assert_int_equal(overlay_freeze(&ov, f->ovl, err, sizeof(err)), -EEXIST);
	assert_int_equal(ov.nr_layers, 2);
	check_all(f, &ov);
	assert_int_equal(overlay_close(&ov), 0);

	/* Frozen layers are byte for byte what they were when frozen. */
	size_t len;
	uint8_t *now = read_file(f->ovl, &len);
	assert_int_equal(len, d0len);
	assert_memory_equal(now, d0, len);
	free(now);
	now = read_file(f->map, &len);
	assert_int_equal(len, m0len);
	assert_memory_equal(now, m0, len);
	free(now);
	now = read_file(l1, &len);
	assert_int_equal(len, d1len);
	assert_memory_equal(now, d1, len);
	free(now);
	path_in(f, l1, sizeof(l1), "l1.map");
	now = read_file(l1, &len);
	assert_int_equal(len, m1len);
	assert_memory_equal(now, m1, len);
	free(now);

	/* Reload the chain from its files. */
	const char *chain[] = {"ovl", "l1", "l2"};
	assert_int_equal(open_chain(f, chain, 3, err, sizeof(err)), 0);

	/* Bad chains. */
	const char *swapped[] = {"l1", "ovl", "l2"};
	assert_int_equal(open_chain(f, swapped, 3, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "is layer 1 of its chain but was given as layer 0"));
	const char *skip[] = {"ovl", "l2"};
	assert_int_equal(open_chain(f, skip, 2, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "is layer 2 of its chain but was given as layer 1"));
	const char *frozen_top[] = {"ovl", "l1"};
	assert_int_equal(open_chain(f, frozen_top, 2, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "frozen layer: it cannot be the writable top"));
	const char *unfrozen_lower[] = {"ovl", "l1", "l2", "l3"};
	assert_int_equal(open_chain(f, unfrozen_lower, 4, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "not frozen: it cannot be a lower layer"));
	const char *missing[] = {"ovl", "nope", "l2"};
	assert_int_equal(open_chain(f, missing, 3, err, sizeof(err)), -ENOENT);
	assert_int_equal(open_chain(f, chain, 0, err, sizeof(err)), -EINVAL);
	const char *many[OVERLAY_CHAIN_MAX + 1];
	for (int i = 0; i <= OVERLAY_CHAIN_MAX; i++)
		many[i] = f->ovl;
	assert_int_equal(
	    overlay_open_chain(&ov, f->base, many, OVERLAY_CHAIN_MAX + 1, 0, err, sizeof(err)),
	    -EINVAL);
	assert_non_null(strstr(err, "1 to 16 layers"));

	/* Layer 0 replaced by another valid frozen map: l1 names a different parent. */
	struct overlay fake = {.chunk_size = CHUNK,
			       .disk_size = DISK_SIZE,
			       .nr_chunks = 5,
			       .bitmap = (uint8_t[1]){0x05},
			       .bitmap_bytes = 1,
			       .frozen = true};
	uint8_t *mb;
	size_t mlen;
	assert_int_equal(overlay_map_build(&fake, &mb, &mlen), 0);
	write_file(f->map, mb, mlen);
	free(mb);
	assert_int_equal(open_chain(f, chain, 3, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "l1.map was made on another parent layer"));
	/* Wrong version in a lower layer. */
	uint8_t *bad = malloc(m0len);
	memcpy(bad, m0, m0len);
	bad[8] = 9;
	write_file(f->map, bad, m0len);
	assert_int_equal(open_chain(f, chain, 3, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "unsupported version 9"));
	/* A lower layer made for another disk size. */
	fake.disk_size = 5 * CHUNK;
	assert_int_equal(overlay_map_build(&fake, &mb, &mlen), 0);
	write_file(f->map, mb, mlen);
	free(mb);
	assert_int_equal(open_chain(f, chain, 3, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "was made for a 327680-byte disk"));
	/* Restored, the chain opens again. */
	write_file(f->map, m0, m0len);
	assert_int_equal(open_chain(f, chain, 3, err, sizeof(err)), 0);
	/* A lower layer's data file shorter than the disk. */
	assert_int_equal(truncate(f->ovl, DISK_SIZE - 1), 0);
	assert_int_equal(open_chain(f, chain, 3, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "not a regular file of at least"));
	(void)l2map;
	free(bad);
	free(d0);
	free(m0);
	free(d1);
	free(m1);
}

/* Freezing up to the cap: 16 layers, and reads fall through all of them. */
static void test_chain_cap(void **state)
{
	struct fx *f = *state;
	struct overlay ov;
	char err[256], p[160];
	char names[OVERLAY_CHAIN_MAX][16];
	const char *chain[OVERLAY_CHAIN_MAX];
	snprintf(names[0], sizeof(names[0]), "ovl");
	chain[0] = names[0];
	assert_int_equal(overlay_open(&ov, f->base, f->ovl, CHUNK, err, sizeof(err)), 0);
	for (int i = 1; i < OVERLAY_CHAIN_MAX; i++) {
		do_write(f, &ov, (uint64_t)(i % 5) * CHUNK + (uint64_t)i * 512, 512, (uint8_t)i);
		snprintf(names[i], sizeof(names[i]), "l%d", i);
		chain[i] = names[i];
		path_in(f, p, sizeof(p), names[i]);
		assert_int_equal(overlay_freeze(&ov, p, err, sizeof(err)), 0);
	}
	assert_int_equal(ov.nr_layers, OVERLAY_CHAIN_MAX - 1);
	path_in(f, p, sizeof(p), "over");
	assert_int_equal(overlay_freeze(&ov, p, err, sizeof(err)), -E2BIG);
	assert_non_null(strstr(err, "cap"));
	do_write(f, &ov, 3 * CHUNK + 7, 100, 99);
	check_all(f, &ov);
	assert_int_equal(overlay_close(&ov), 0);
	assert_int_equal(open_chain(f, chain, OVERLAY_CHAIN_MAX, err, sizeof(err)), 0);
}

static void test_write_zeroes(void **state)
{
	struct fx *f = *state;
	struct overlay ov;
	char err[256], l1[160];
	path_in(f, l1, sizeof(l1), "l1");
	assert_int_equal(overlay_open(&ov, f->base, f->ovl, CHUNK, err, sizeof(err)), 0);
	do_write(f, &ov, 0, 2 * CHUNK, 1);
	assert_int_equal(overlay_freeze(&ov, l1, err, sizeof(err)), 0);
	/* Partial chunk over a frozen chunk: copy-up keeps the rest of the chunk. */
	uint64_t before = ov.copy_ups;
	assert_int_equal(overlay_write_zeroes(&ov, 512, 1024, false), 0);
	memset(f->want + 512, 0, 1024);
	assert_int_equal(ov.copy_ups, before + 1);
	/* Partial over the base, across a chunk boundary into a whole chunk with unmap. */
	assert_int_equal(overlay_write_zeroes(&ov, 2 * CHUNK + 4096, 2 * CHUNK - 4096, true), 0);
	memset(f->want + 2 * CHUNK + 4096, 0, 2 * CHUNK - 4096);
	assert_true(overlay_chunk_allocated(&ov, 2));
	assert_true(overlay_chunk_allocated(&ov, 3));
	/* A whole frozen chunk, no unmap: written zeros hide the layer below. */
	assert_int_equal(overlay_write_zeroes(&ov, CHUNK, CHUNK, false), 0);
	memset(f->want + CHUNK, 0, CHUNK);
	/* The short last chunk, whole, with unmap. */
	assert_int_equal(overlay_write_zeroes(&ov, 4 * CHUNK, 12288, true), 0);
	memset(f->want + 4 * CHUNK, 0, 12288);
	check_all(f, &ov);
	/* A hole punched in a chunk that already held data reads as zeros too. */
	do_write(f, &ov, 3 * CHUNK, CHUNK, 9);
	check_all(f, &ov);
	assert_int_equal(overlay_write_zeroes(&ov, 3 * CHUNK, CHUNK, true), 0);
	memset(f->want + 3 * CHUNK, 0, CHUNK);
	check_all(f, &ov);
	assert_int_equal(overlay_write_zeroes(&ov, DISK_SIZE - 512, 1024, false), -EINVAL);
	assert_int_equal(overlay_write_zeroes(&ov, DISK_SIZE + 512, 0, false), -EINVAL);
	assert_int_equal(overlay_write_zeroes(&ov, DISK_SIZE, 0, false), 0);
	assert_int_equal(overlay_close(&ov), 0);
	const char *chain[] = {"ovl", "l1"};
	assert_int_equal(open_chain(f, chain, 2, err, sizeof(err)), 0);
}

static int zio_res, zio_done;

static void zio_cb(struct blk_io *io, int res)
{
	(void)io;
	zio_res = res;
	zio_done++;
}

static int run_io(struct blk_uring *b, struct blk_io *io)
{
	zio_done = 0;
	io->done = zio_cb;
	int r = blk_uring_queue(b, io);
	if (r)
		return r;
	assert_int_equal(blk_uring_submit(b), 0);
	for (int i = 0; !zio_done && i < 100; i++) {
		struct pollfd pfd = {b->efd, POLLIN, 0};
		poll(&pfd, 1, 100);
		blk_uring_reap(b);
	}
	assert_int_equal(zio_done, 1);
	return zio_res;
}

/* WRITE_ZEROES on a raw file in `dir`: fallocate, or zero writes where it is unsupported. */
static void zeroes_in(const char *dir, bool force_writes)
{
	char path[300];
	snprintf(path, sizeof(path), "%s/raw.img", dir);
	size_t size = 3u << 20;
	uint8_t *want = malloc(size);
	for (size_t i = 0; i < size; i++)
		want[i] = base_byte(i) | 1;
	write_file(path, want, size);
	struct blk_uring b;
	int r = blk_uring_open(&b, path, false);
	if (r) {
		print_message("io_uring unavailable (%s)\n", strerror(-r));
		unlink(path);
		free(want);
		skip();
	}
	b.no_zero_range = force_writes;
	struct blk_io io = {.op = BLK_OP_WRITE_ZEROES, .offset = 4096, .len = (3u << 19) + 512};
	assert_int_equal(run_io(&b, &io), 0);
	memset(want + 4096, 0, (3u << 19) + 512);
	io = (struct blk_io){
	    .op = BLK_OP_WRITE_ZEROES, .offset = (2u << 20) + 512, .len = 8192, .unmap = true};
	assert_int_equal(run_io(&b, &io), 0);
	memset(want + (2u << 20) + 512, 0, 8192);
	/* Up to the end of the file, after the back end may have switched to zero writes. */
	io = (struct blk_io){.op = BLK_OP_WRITE_ZEROES, .offset = size - 1536, .len = 1536};
	assert_int_equal(run_io(&b, &io), 0);
	memset(want + size - 1536, 0, 1536);
	io = (struct blk_io){.op = BLK_OP_WRITE_ZEROES, .offset = 0, .len = 0};
	assert_int_equal(run_io(&b, &io), -EINVAL);
	print_message("%s: %s\n", dir, b.no_zero_range ? "zero writes" : "fallocate");
	blk_uring_close(&b);
	size_t len;
	uint8_t *got = read_file(path, &len);
	assert_int_equal(len, size);
	assert_memory_equal(got, want, size);
	free(got);
	assert_int_equal(blk_uring_open(&b, path, true), 0);
	io = (struct blk_io){.op = BLK_OP_WRITE_ZEROES, .offset = 0, .len = 512};
	assert_int_equal(run_io(&b, &io), -EROFS);
	blk_uring_close(&b);
	unlink(path);
	free(want);
}

static void test_blk_write_zeroes(void **state)
{
	struct fx *f = *state;
	zeroes_in(f->dir, false);
	zeroes_in(f->dir, true);		    /* as after an EOPNOTSUPP */
	char shm[] = "/dev/shm/cove-zeroes-XXXXXX"; /* tmpfs: no ZERO_RANGE */
	if (mkdtemp(shm)) {
		zeroes_in(shm, false);
		rmdir(shm);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_copy_up_and_reads, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_persist_and_reload, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_bad_maps, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_v1_map, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_freeze_chain, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_chain_cap, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_write_zeroes, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_blk_write_zeroes, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
