/* Files beneath a directory fd, never through a link: every write into a chain or overlay directory
 * goes through here. */
#include "common/dirfd_io.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/errmsg.h"

bool dirfd_plain_name(const char *name)
{
	size_t n = strnlen(name, 256);
	if (n == 0 || n > 255 || name[0] == '.')
		return false;
	for (size_t i = 0; i < n; i++)
		if (name[i] == '/' || name[i] < 0x21 || name[i] > 0x7e)
			return false;
	return true;
}

/* One path component of our own making (temp names start with '.'): no '/', not . or ... */
static bool component_ok(const char *name)
{
	size_t n = strnlen(name, 256);
	return n > 0 && n <= 255 && !strchr(name, '/') && strcmp(name, ".") && strcmp(name, "..");
}

int dirfd_open_dir(const char *path, bool create, char *err, size_t errlen)
{
	if (create && mkdir(path, 0700) < 0 && errno != EEXIST)
		return errmsg(err, errlen, -errno, "cannot create directory %s: %s", path,
			      strerror(errno));
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return errmsg(err, errlen, -errno, "cannot open directory %s: %s", path,
			      strerror(errno));
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		close(fd);
		return errmsg(err, errlen, -e, "%s: %s", path, strerror(e));
	}
	if (st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH))) {
		close(fd);
		return errmsg(err, errlen, -EPERM,
			      "directory %s is not ours or is writable by others (owner %u, mode "
			      "%03o): refusing to write into it",
			      path, (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777));
	}
	return fd;
}

int dirfd_open_parent(const char *path, char *name, size_t cap)
{
	char *a = strdup(path), *b = strdup(path);
	int r = -ENOMEM;
	if (!a || !b)
		goto out;
	const char *base = basename(a);
	r = -EINVAL;
	if (!component_ok(base) || strlen(base) >= cap)
		goto out;
	memcpy(name, base, strlen(base) + 1);
	r = open(dirname(b), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (r < 0)
		r = -errno;
out:
	free(a);
	free(b);
	return r;
}

int dirfd_create(int dfd, const char *name, int flags, mode_t mode)
{
	if (!component_ok(name))
		return -EINVAL;
	if (unlinkat(dfd, name, 0) < 0 && errno != ENOENT)
		return -errno;
	int fd = openat(dfd, name, flags | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
	return fd < 0 ? -errno : fd;
}

int dirfd_create_new(int dfd, const char *name, int flags, mode_t mode)
{
	if (!component_ok(name))
		return -EINVAL;
	int fd = openat(dfd, name, flags | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
	return fd < 0 ? -errno : fd;
}

int dirfd_create_tmp(int dfd, const char *final, char *tmp, size_t cap, int flags, mode_t mode)
{
	int fd = -EEXIST;
	for (int i = 0; i < 8 && fd == -EEXIST; i++) {
		uint32_t rnd = 0;
		if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != sizeof(rnd))
			rnd ^= (uint32_t)i * 0x9e3779b9u; /* uniqueness only; EEXIST moves on */
		if (snprintf(tmp, cap, ".%s.%d-%08x.tmp", final, (int)getpid(), rnd) >= (int)cap)
			return -ENAMETOOLONG;
		fd = dirfd_create_new(dfd, tmp, flags, mode);
	}
	return fd;
}

int dirfd_open(int dfd, const char *name, int flags)
{
	if (!component_ok(name) || (flags & O_CREAT))
		return -EINVAL;
	int fd = openat(dfd, name, flags | O_NOFOLLOW | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

int dirfd_rename(int dfd, const char *from, const char *to)
{
	if (!component_ok(from) || !component_ok(to))
		return -EINVAL;
	return renameat(dfd, from, dfd, to) < 0 ? -errno : 0;
}

int dirfd_rename_noreplace(int dfd, const char *from, const char *to)
{
	if (!component_ok(from) || !component_ok(to))
		return -EINVAL;
	return renameat2(dfd, from, dfd, to, RENAME_NOREPLACE) < 0 ? -errno : 0;
}

int dirfd_unlink(int dfd, const char *name)
{
	if (!component_ok(name))
		return -EINVAL;
	return unlinkat(dfd, name, 0) < 0 ? -errno : 0;
}

int dirfd_sync(int dfd)
{
	return fsync(dfd) < 0 ? -errno : 0;
}
