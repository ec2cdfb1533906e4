/* Recursive size and removal of a sandbox's files. */
#include "lifecycle/tree.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Deeper than any sandbox directory gets; a guard, not a limit anyone meets. */
#define TREE_DEPTH 16

static uint64_t bytes_at(int dfd, const char *name, int depth)
{
	struct stat st;
	uint64_t sum;
	struct dirent *e;
	DIR *d;
	int fd;

	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return 0;
	sum = (uint64_t)st.st_blocks * 512;
	if (!S_ISDIR(st.st_mode) || depth >= TREE_DEPTH)
		return sum;
	fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 || !(d = fdopendir(fd))) {
		if (fd >= 0)
			close(fd);
		return sum;
	}
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			sum += bytes_at(dirfd(d), e->d_name, depth + 1);
	closedir(d);
	return sum;
}

uint64_t sbx_tree_bytes(int dfd, const char *name)
{
	return bytes_at(dfd, name, 0);
}

static int remove_at(int dfd, const char *name, int depth)
{
	struct stat st;
	struct dirent *e;
	DIR *d;
	int fd, ret = 0;

	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISDIR(st.st_mode))
		return unlinkat(dfd, name, 0) < 0 && errno != ENOENT ? -errno : 0;
	if (depth >= TREE_DEPTH)
		return -ELOOP;
	fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -errno;
	}
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		int r = remove_at(dirfd(d), e->d_name, depth + 1);

		if (r && !ret)
			ret = r;
	}
	closedir(d);
	if (unlinkat(dfd, name, AT_REMOVEDIR) < 0 && !ret)
		ret = -errno;
	return ret;
}

int sbx_tree_remove(int dfd, const char *name)
{
	return remove_at(dfd, name, 0);
}
