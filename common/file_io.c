/* Positioned whole-buffer reads and writes (short transfers and EINTR resumed); streams: fd_io. */
#include "common/file_io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
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

/* Bytes [off, end) by pread/pwrite: where copy_file_range cannot go (across filesystems...). */
static int copy_plain(int in, int out, off_t off, off_t end)
{
	enum { CHUNK = 1 << 20 };
	char *buf = malloc(CHUNK);
	int ret = buf ? 0 : -ENOMEM;

	while (!ret && off < end) {
		size_t want = end - off < CHUNK ? (size_t)(end - off) : CHUNK;
		ssize_t n = pread(in, buf, want, off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			ret = n < 0 ? -errno : -EIO; /* shorter than it was: changed under us */
			break;
		}
		ret = pwrite_full(out, buf, (size_t)n, off);
		off += n;
	}
	free(buf);
	return ret;
}

int file_copy_runs(int in, int out, off_t from, off_t end)
{
	off_t off = from;

	while (off < end) {
		off_t data = lseek(in, off, SEEK_DATA), hole;

		if (data < 0)
			return errno == ENXIO ? 0 : copy_plain(in, out, off, end);
		if (data >= end)
			return 0;
		hole = lseek(in, data, SEEK_HOLE);
		if (hole < 0 || hole > end)
			hole = end;
		for (loff_t src = data, dst = data; src < hole;) {
			ssize_t k = copy_file_range(in, &src, out, &dst, (size_t)(hole - src), 0);

			if (k < 0 && errno == EINTR)
				continue;
			if (k < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS ||
				      errno == EOPNOTSUPP))
				return copy_plain(in, out, (off_t)src, end);
			if (k <= 0)
				return k < 0 ? -errno : -EIO;
		}
		off = hole;
	}
	return 0;
}

int file_write_str(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	size_t len = strlen(text);
	ssize_t n = write(fd, text, len);
	int e = n < 0 ? -errno : (size_t)n != len ? -EIO : 0;
	close(fd);
	return e;
}

int file_data_runs(int fd, uint64_t size, size_t max, struct file_run **out, size_t *n)
{
	struct file_run *e = NULL;
	size_t cnt = 0, cap = 0;
	off_t off = 0;

	while ((uint64_t)off < size) {
		off_t data = lseek(fd, off, SEEK_DATA), hole;

		if ((data < 0 && errno == ENXIO) || (data >= 0 && (uint64_t)data >= size))
			break;
		hole = data < 0 ? -1 : lseek(fd, data, SEEK_HOLE);
		if (data < 0 || hole < 0 || cnt == max) {
			cnt = 0; /* no usable map: the whole file */
			e = e ? e : malloc(sizeof(*e));
			if (!e)
				return -ENOMEM;
			e[cnt++] = (struct file_run){0, size};
			break;
		}
		if ((uint64_t)hole > size)
			hole = (off_t)size;
		if (cnt == cap) {
			struct file_run *m = realloc(e, (cap = cap ? 2 * cap : 64) * sizeof(*e));

			if (!m) {
				free(e);
				return -ENOMEM;
			}
			e = m;
		}
		e[cnt++] = (struct file_run){(uint64_t)data, (uint64_t)(hole - data)};
		off = hole;
	}
	*out = e;
	*n = cnt;
	return 0;
}
