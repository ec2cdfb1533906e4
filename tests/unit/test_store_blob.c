/* Unit tests of lifecycle/store/blob.c: packed data runs, the digest, hostile blobs refused. */
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

#include "common/byteorder.h"
#include "common/file_io.h"
#include "lifecycle/store/blob.h"

static int tmpfile_fd(void)
{
	char p[] = "/tmp/cove-blob-XXXXXX";
	int fd = mkstemp(p);
	assert_true(fd >= 0);
	unlink(p);
	return fd;
}

/* A sparse file: 64 MiB with data at 0, at 5 MiB + 7 (unaligned) and the last byte. */
static int sparse_file(uint64_t *size)
{
	int fd = tmpfile_fd();
	*size = 64ull << 20;
	assert_int_equal(ftruncate(fd, (off_t)*size), 0);
	uint8_t a[8192], b[3000], c = 0x5a;
	for (size_t i = 0; i < sizeof(a); i++)
		a[i] = (uint8_t)(i * 7 + 1);
	memset(b, 0xc3, sizeof(b));
	assert_int_equal(pwrite_full(fd, a, sizeof(a), 0), 0);
	assert_int_equal(pwrite_full(fd, b, sizeof(b), (5 << 20) + 7), 0);
	assert_int_equal(pwrite_full(fd, &c, 1, (off_t)*size - 1), 0);
	return fd;
}

static void test_pack_verify_unpack(void **state)
{
	(void)state;
	uint64_t size, blen;
	int in = sparse_file(&size), blob = tmpfile_fd(), out = tmpfile_fd();
	uint8_t d[DIGEST_LEN], want[DIGEST_LEN];
	char err[256];
	assert_int_equal(store_blob_pack(in, blob, d, &blen, NULL, err, sizeof(err)), 0);
	/* The blob's name is the chain's digest of the file. */
	assert_int_equal(digest_fd(in, want), 0);
	assert_memory_equal(d, want, DIGEST_LEN);
	struct stat st;
	assert_int_equal(fstat(blob, &st), 0);
	assert_int_equal((uint64_t)st.st_size, blen);
	assert_true(blen < (1u << 20)); /* the holes are not in it */
	struct store_blob_info info;
	assert_int_equal(store_blob_verify(blob, blen, size, d, "mem-1", &info, err, sizeof(err)),
			 0);
	assert_int_equal(info.size, size);
	assert_int_equal(store_blob_unpack(blob, &info, out, err, sizeof(err)), 0);
	assert_int_equal(digest_fd(out, want), 0);
	assert_memory_equal(d, want, DIGEST_LEN);
	assert_int_equal(fstat(out, &st), 0);
	assert_int_equal((uint64_t)st.st_size, size);
	assert_true((uint64_t)st.st_blocks * 512 < (4u << 20)); /* holes stay holes */
	/* An empty file: a header alone. */
	int e = tmpfile_fd(), eb = tmpfile_fd();
	assert_int_equal(store_blob_pack(e, eb, d, &blen, NULL, err, sizeof(err)), 0);
	assert_int_equal(blen, STORE_BLOB_HDR);
	assert_int_equal(store_blob_verify(eb, blen, 0, d, "empty", &info, err, sizeof(err)), 0);
	close(e);
	close(eb);
	close(in);
	close(blob);
	close(out);
}

/* Every hostile blob is refused with one line naming it; none is unpacked. */
static void test_hostile(void **state)
{
	(void)state;
	uint64_t size, blen;
	int in = sparse_file(&size), blob = tmpfile_fd();
	uint8_t d[DIGEST_LEN];
	char err[256];
	assert_int_equal(store_blob_pack(in, blob, d, &blen, NULL, err, sizeof(err)), 0);
	uint8_t *orig = malloc(blen);
	assert_non_null(orig);
	assert_int_equal(pread_full(blob, orig, blen, 0), 0);
	struct store_blob_info info;
	struct {
		size_t at;
		uint8_t x;
		int want;
		const char *says;
	} cases[] = {
	    {0, 'X', -EBADMSG, "not a cove blob"},
	    {20, 1, -EBADMSG, "not a cove blob"},		       /* flags */
	    {19, 0x01, -EBADMSG, "does not fit"},		       /* nr_runs huge */
	    {STORE_BLOB_HDR + 16 + 0, 0x01, -EBADMSG, "out of order"}, /* run 1 moved onto run 0 */
	    {blen - 1, 0xff, -EILSEQ, "mem-9: blob content has digest"}, /* a data byte */
	    {14, 0x01, -EFBIG, "over"},					 /* size > max */
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint8_t *b = malloc(blen);
		memcpy(b, orig, blen);
		if (cases[i].at == STORE_BLOB_HDR + 16)
			put_le64(b + STORE_BLOB_HDR + 16, 100); /* inside run 0 */
		else
			b[cases[i].at] ^= cases[i].x;
		int f = tmpfile_fd();
		assert_int_equal(pwrite_full(f, b, blen, 0), 0);
		int r = store_blob_verify(f, blen, size, d, "mem-9", &info, err, sizeof(err));
		if (r != cases[i].want || !strstr(err, cases[i].says))
			fail_msg("case %zu: %d %s", i, r, err);
		assert_null(strchr(err, '\n'));
		close(f);
		free(b);
	}
	/* Short: cut the last byte. */
	int f = tmpfile_fd();
	assert_int_equal(pwrite_full(f, orig, blen - 1, 0), 0);
	assert_int_equal(store_blob_verify(f, blen - 1, size, d, "x", &info, err, sizeof(err)),
			 -EBADMSG);
	assert_non_null(strstr(err, "its map says"));
	close(f);
	/* A blob named by another digest. */
	uint8_t other[DIGEST_LEN];
	memcpy(other, d, DIGEST_LEN);
	other[0] ^= 1;
	assert_int_equal(store_blob_verify(blob, blen, size, other, "x", &info, err, sizeof(err)),
			 -EILSEQ);
	free(orig);
	close(in);
	close(blob);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_pack_verify_unpack),
	    cmocka_unit_test(test_hostile),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
