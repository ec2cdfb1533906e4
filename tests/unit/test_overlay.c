/* Unit tests of the copy-on-write overlay: copy-up, mixed reads, map persistence, bad map files. */
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

#include "overlay.h"

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

static void write_file(const char *path, const void *buf, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, buf, len), (ssize_t)len);
	close(fd);
}

static uint8_t *read_file(const char *path, size_t *len)
{
	int fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	struct stat st;
	assert_int_equal(fstat(fd, &st), 0);
	uint8_t *buf = malloc((size_t)st.st_size + 1);
	assert_int_equal(read(fd, buf, (size_t)st.st_size), st.st_size);
	close(fd);
	*len = (size_t)st.st_size;
	return buf;
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
	char p[160];
	const char *names[] = {"base.img", "ovl", "ovl.map", "ovl.map.tmp", "base2.img"};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		snprintf(p, sizeof(p), "%s/%s", f->dir, names[i]);
		unlink(p);
	}
	rmdir(f->dir);
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
	bad[8] = 2; /* version */
	assert_int_equal(open_with_map(f, bad, len, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "unsupported version 2"));

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

static void test_crc32(void **state)
{
	(void)state;
	/* The standard check value of CRC-32/ISO-HDLC. */
	assert_int_equal(overlay_crc32(0, "123456789", 9), 0xcbf43926u);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_crc32),
	    cmocka_unit_test_setup_teardown(test_copy_up_and_reads, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_persist_and_reload, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_bad_maps, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
