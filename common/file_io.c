/* Positioned whole-buffer reads and writes (short transfers and EINTR resumed); streams: fd_io. */
#include "common/file_io.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <unistd.h>

/* off < 0: at the file position. *done: bytes moved; 0 or -errno; `eof_ok` stops at EOF. */
static int io_loop(int fd, bool wr, void *buf, size_t len, off_t off, bool eof_ok, size_t *done)
{
	uint8_t *p = buf;
	*done = 0;
	while (*done < len) {
		size_t n = len - *done;
		ssize_t k = off < 0 ? (wr ? write(fd, p, n) : read(fd, p, n))
				    : (wr ? pwrite(fd, p, n, off) : pread(fd, p, n, off));
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		if (k == 0)
			return eof_ok ? 0 : -EIO;
		p += k;
		*done += (size_t)k;
		if (off >= 0)
			off += k;
	}
	return 0;
}

int pread_full(int fd, void *buf, size_t len, off_t off)
{
	size_t done;
	return io_loop(fd, false, buf, len, off, false, &done);
}

int pwrite_full(int fd, const void *buf, size_t len, off_t off)
{
	size_t done;
	return io_loop(fd, true, (void *)buf, len, off, false, &done);
}
