/* Whole-buffer positioned reads and writes for snapshot files (short transfers and EINTR resumed). */
#include "common/file_io.h"

#include <errno.h>
#include <stdint.h>
#include <unistd.h>

int pread_full(int fd, void *buf, size_t len, off_t off)
{
	uint8_t *p = buf;
	while (len) {
		ssize_t k = pread(fd, p, len, off);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return k < 0 ? -errno : -EIO;
		p += k;
		len -= (size_t)k;
		off += k;
	}
	return 0;
}

int pwrite_full(int fd, const void *buf, size_t len, off_t off)
{
	const uint8_t *p = buf;
	while (len) {
		ssize_t k = pwrite(fd, p, len, off);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return k < 0 ? -errno : -EIO;
		p += k;
		len -= (size_t)k;
		off += k;
	}
	return 0;
}
