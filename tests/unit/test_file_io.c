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

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_file_io),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
