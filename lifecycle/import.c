/* A checkpoint's archive copied in and unpacked with every check (lifecycle/import.h). */
#include "lifecycle/import.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "common/file_io.h"
#include "lifecycle/tree.h"

/* One entry of src copied into adfd (holes stay holes). 0 or -errno with err. */
static int copy_in(int sfd, int adfd, const char *name, char *err, size_t errlen)
{
	int in = openat(sfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	struct stat sb;
	int out = -1, ret = 0;

	if (in < 0 && errno == ELOOP)
		return errmsg(err, errlen, -EINVAL, "checkpoint: %s is not a regular file (a link)",
			      name);
	if (in < 0)
		return errmsg(err, errlen, -errno, "checkpoint: %s: %s", name, strerror(errno));
	if (fstat(in, &sb) < 0)
		ret = errmsg(err, errlen, -errno, "checkpoint: %s: %s", name, strerror(errno));
	else if (!S_ISREG(sb.st_mode))
		ret = errmsg(err, errlen, -EINVAL, "checkpoint: %s is not a regular file", name);
	else if ((uint64_t)sb.st_size > SBX_ARCHIVE_MAX_FILE)
		ret = errmsg(err, errlen, -EFBIG, "checkpoint: %s is larger than %llu bytes", name,
			     (unsigned long long)SBX_ARCHIVE_MAX_FILE);
	else if ((out = dirfd_create(adfd, name, O_WRONLY | O_CLOEXEC, 0600)) < 0)
		ret = errmsg(err, errlen, out, "checkpoint: %s: %s", name, strerror(-out));
	else if ((ret = file_copy_runs(in, out, 0, sb.st_size)) ||
		 (ret = ftruncate(out, sb.st_size) < 0 ? -errno : 0))
		errmsg(err, errlen, ret, "checkpoint: copying %s: %s", name, strerror(-ret));
	if (out >= 0)
		close(out);
	close(in);
	return ret;
}

/* src's entries copied into adfd. 0 or -errno with err. */
static int copy_all(int sfd, int adfd, char *err, size_t errlen)
{
	int dup_fd = dup(sfd);
	DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
	struct dirent *e;
	size_t n = 0;
	int ret = 0;

	if (!d) {
		if (dup_fd >= 0)
			close(dup_fd);
		return errmsg(err, errlen, -errno, "checkpoint: %s", strerror(errno));
	}
	while (!ret && (e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (!dirfd_plain_name(e->d_name))
			ret = errmsg(err, errlen, -EINVAL,
				     "checkpoint: an entry whose name is not a plain file name");
		else if (++n > SBX_ARCHIVE_MAX_FILES + 1) /* + the manifest */
			ret = errmsg(err, errlen, -E2BIG, "checkpoint: more than %d files",
				     SBX_ARCHIVE_MAX_FILES);
		else
			ret = copy_in(sfd, adfd, e->d_name, err, errlen);
	}
	closedir(d);
	return ret;
}

/* The sandbox's own disk overlays (the template clone's) removed: the archive brings its own. */
static int drop_overlays(int dfd)
{
	int dup_fd = dup(dfd);
	DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
	struct dirent *e;
	int ret = 0;

	if (!d) {
		if (dup_fd >= 0)
			close(dup_fd);
		return -errno;
	}
	while (!ret && (e = readdir(d)))
		if (sbx_archive_top_file(e->d_name) && unlinkat(dfd, e->d_name, 0) < 0)
			ret = -errno;
	closedir(d);
	return ret;
}

int sbx_import_archive(int dfd, const char *src, struct sbx_archive_stats *st, char *err,
		       size_t errlen)
{
	int sfd = open(src, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), adfd = -1, ret;

	memset(st, 0, sizeof(*st));
	if (sfd < 0)
		return errmsg(err, errlen, -errno, "checkpoint %s: %s", src, strerror(errno));
	sbx_tree_remove(dfd, SBX_ARCHIVE);
	if (mkdirat(dfd, SBX_ARCHIVE, 0700) < 0 ||
	    (adfd = openat(dfd, SBX_ARCHIVE, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
		ret = errmsg(err, errlen, -errno, "archive directory: %s", strerror(errno));
	else
		ret = copy_all(sfd, adfd, err, errlen);
	if (!ret && (ret = drop_overlays(dfd)))
		errmsg(err, errlen, ret, "removing the template's overlays: %s", strerror(-ret));
	if (!ret)
		ret = sbx_archive_unpack(dfd, st, err, errlen);
	if (adfd >= 0)
		close(adfd);
	close(sfd);
	return ret;
}

int sbx_archive_copy_out(int dfd, const char *dst, char *err, size_t errlen)
{
	int adfd = openat(dfd, SBX_ARCHIVE, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), ddfd;
	int ret;

	if (adfd < 0)
		return errmsg(err, errlen, -errno, "the sandbox's archive: %s", strerror(errno));
	if (mkdir(dst, 0700) < 0) {
		ret = errmsg(err, errlen, -errno, "%s: %s", dst, strerror(errno));
		close(adfd);
		return ret;
	}
	ddfd = open(dst, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (ddfd < 0)
		ret = errmsg(err, errlen, -errno, "%s: %s", dst, strerror(errno));
	else
		ret = copy_all(adfd, ddfd, err, errlen);
	if (!ret && (ret = dirfd_sync(ddfd)))
		errmsg(err, errlen, ret, "%s: sync: %s", dst, strerror(-ret));
	if (ddfd >= 0)
		close(ddfd);
	close(adfd);
	return ret;
}
