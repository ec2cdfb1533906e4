/* flock-based lock files beneath a sandbox directory fd. */
#include "lifecycle/lock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <unistd.h>

static int lock_take(int dfd, const char *file, int mode, bool wait, bool keep_on_exec)
{
	int flags = mode | O_CREAT | O_NOFOLLOW | (keep_on_exec ? 0 : O_CLOEXEC);
	int fd = openat(dfd, file, flags, 0600);

	if (fd < 0)
		return -errno;
	while (flock(fd, LOCK_EX | (wait ? 0 : LOCK_NB)) < 0) {
		int e = errno;

		if (e == EINTR)
			continue;
		close(fd);
		return e == EAGAIN ? -EWOULDBLOCK : -e;
	}
	return fd;
}

int sbx_lock_take(int dfd, const char *file, bool wait, bool keep_on_exec)
{
	/* Read-only: flock needs no write access, and whoever inherits it cannot write. */
	return lock_take(dfd, file, O_RDONLY, wait, keep_on_exec);
}

int sbx_lock_take_rw(int dfd, const char *file)
{
	return lock_take(dfd, file, O_RDWR, false, false);
}

int sbx_lock_write_pid(int dfd, const char *file, pid_t pid)
{
	int fd = openat(dfd, file, O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
	int r = 0;

	if (fd < 0)
		return -errno;
	if (ftruncate(fd, 0) < 0 || dprintf(fd, "%d\n", (int)pid) < 0)
		r = -errno;
	if (close(fd) < 0 && !r)
		r = -errno;
	return r;
}

int sbx_lock_held(int dfd, const char *file)
{
	int fd = openat(dfd, file, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	int ret = 0;

	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	/* A shared lock is refused only while someone holds the exclusive one. */
	if (flock(fd, LOCK_SH | LOCK_NB) < 0)
		ret = errno == EWOULDBLOCK ? 1 : -errno;
	close(fd);
	return ret;
}

pid_t sbx_lock_pid(int dfd, const char *file)
{
	char buf[24] = "";
	int held = sbx_lock_held(dfd, file);
	int fd;
	ssize_t n;
	long v;

	if (held <= 0)
		return held;
	fd = openat(dfd, file, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	close(fd);
	if (n <= 0)
		return -EIO;
	buf[n] = '\0';
	v = strtol(buf, NULL, 10);
	return v > 0 && v < (1L << 22) ? (pid_t)v : -EIO;
}
