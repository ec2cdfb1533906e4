/* Whole-file write and read for unit tests (asserting, not -errno: a test stops at the first failure). */
#ifndef COVE_TEST_FILE_HELPERS_H
#define COVE_TEST_FILE_HELPERS_H

#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static inline void write_file(const char *path, const void *buf, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, buf, len), (ssize_t)len);
	close(fd);
}

/* The whole file in a malloc'ed buffer (one spare byte); *len gets its size. */
static inline uint8_t *read_file(const char *path, size_t *len)
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

#endif
