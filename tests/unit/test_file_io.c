/* Unit tests for common/file_io: positioned whole-buffer reads and writes and their end-of-file
 * rule (stream reads and writes: test_fd_io). */
#include <fcntl.h>

#include "helpers.h"
#include "common/file_io.h"

static void test_file_io(void **state)
{
	(void)state;
	char path[] = "/tmp/cove-file-io-XXXXXX";
	tmp_file(path, 0);
	int fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	static uint8_t data[300000], back[300000];
	for (size_t i = 0; i < sizeof(data); i++)
		data[i] = (uint8_t)(i * 31 + 7);
	assert_int_equal(pwrite_full(fd, data, 1000, 0), 0);
	assert_int_equal(pwrite_full(fd, data + 1000, sizeof(data) - 1000, 1000), 0);
	assert_int_equal(pread_full(fd, back, sizeof(back), 0), 0);
	assert_memory_equal(back, data, sizeof(data));
	/* Past the end: exact reads fail with -EIO. */
	assert_int_equal(pread_full(fd, back, 10, sizeof(data) - 5), -EIO);
	assert_int_equal(pread_full(fd, back, 50, 100), 0);
	assert_memory_equal(back, data + 100, 50);
	close(fd);
	/* A bad descriptor is its errno. */
	assert_int_equal(pread_full(-1, back, 1, 0), -EBADF);
	assert_int_equal(pwrite_full(-1, data, 1, 0), -EBADF);
	unlink(path);
}

/* Data runs are copied to the same offsets, holes stay holes, nothing outside [from, end). */
static void test_copy_runs(void **state)
{
	(void)state;
	char tin[] = "/tmp/cove-copyruns-in-XXXXXX", tout[] = "/tmp/cove-copyruns-out-XXXXXX";
	int in = mkstemp(tin), out = mkstemp(tout);
	uint8_t a[4096], b[4096], got[4096];
	assert_true(in >= 0 && out >= 0);
	unlink(tin);
	unlink(tout);
	memset(a, 0xa5, sizeof(a));
	memset(b, 0x5a, sizeof(b));
	/* data at 0, a 1 MiB hole, data at 1 MiB + 4 KiB, then a tail hole to 4 MiB */
	assert_int_equal(pwrite_full(in, a, sizeof(a), 0), 0);
	assert_int_equal(pwrite_full(in, b, sizeof(b), (1 << 20) + 4096), 0);
	assert_int_equal(ftruncate(in, 4 << 20), 0);
	assert_int_equal(ftruncate(out, 4 << 20), 0);
	assert_int_equal(file_copy_runs(in, out, 4096, 4 << 20), 0); /* skips the first run */
	assert_int_equal(pread_full(out, got, sizeof(got), 0), 0);
	for (size_t i = 0; i < sizeof(got); i++)
		assert_int_equal(got[i], 0);
	assert_int_equal(pread_full(out, got, sizeof(got), (1 << 20) + 4096), 0);
	assert_memory_equal(got, b, sizeof(b));
	/* where the filesystem reports holes, the copy has them too */
	off_t d = lseek(out, 0, SEEK_DATA);
	assert_true(d < 0 || d >= (1 << 20));
	assert_int_equal(file_copy_runs(in, out, 0, 4 << 20), 0);
	assert_int_equal(pread_full(out, got, sizeof(got), 0), 0);
	assert_memory_equal(got, a, sizeof(a));
	close(in);
	close(out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_file_io),
	    cmocka_unit_test(test_copy_runs),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
