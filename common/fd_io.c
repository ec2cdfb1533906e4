/* Whole-buffer stream reads and writes: one loop for the agent wire, cove-init and the broker. */
#include "common/fd_io.h"

#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

int write_full(int fd, const void *buf, size_t n)
{
	size_t done = 0;

	while (done < n) {
		/* send() so a peer that went away is -EPIPE, not a signal; write() for a pipe or
		 * file. */
		ssize_t r = send(fd, (const char *)buf + done, n - done, MSG_NOSIGNAL);

		if (r < 0 && errno == ENOTSOCK)
			r = write(fd, (const char *)buf + done, n - done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		done += (size_t)r;
	}
	return 0;
}

ssize_t read_upto(int fd, void *buf, size_t cap)
{
	size_t got = 0;

	while (got < cap) {
		ssize_t r = read(fd, (char *)buf + got, cap - got);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			break;
		got += (size_t)r;
	}
	return (ssize_t)got;
}

int read_full(int fd, void *buf, size_t n)
{
	ssize_t got = read_upto(fd, buf, n);

	if (got < 0)
		return (int)got;
	if ((size_t)got < n)
		return got ? -EPIPE : -ENODATA;
	return 0;
}
