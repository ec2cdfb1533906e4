/* Unit tests for common/file_io: the one read/write-everything loop and its end-of-file rules. */
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
	assert_int_equal(write_full(fd, data, 1000), 0);
	assert_int_equal(pwrite_full(fd, data + 1000, sizeof(data) - 1000, 1000), 0);
	assert_int_equal(pread_full(fd, back, sizeof(back), 0), 0);
	assert_memory_equal(back, data, sizeof(data));
	/* Past the end: exact reads fail with -EIO, read_upto stops and says how much it got. */
	assert_int_equal(pread_full(fd, back, 10, sizeof(data) - 5), -EIO);
	assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
	size_t got = 0;
	assert_int_equal(read_upto(fd, back, sizeof(back), &got), 0);
	assert_int_equal(got, sizeof(data));
	assert_int_equal(lseek(fd, 100, SEEK_SET), 100);
	assert_int_equal(read_upto(fd, back, 50, &got), 0);
	assert_int_equal(got, 50);
	assert_memory_equal(back, data + 100, 50);
	assert_int_equal(read_full(fd, back, sizeof(back)), -EIO);
	close(fd);
	/* A bad descriptor is its errno. */
	assert_int_equal(read_full(-1, back, 1), -EBADF);
	assert_int_equal(write_full(-1, data, 1), -EBADF);
	unlink(path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_file_io),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
