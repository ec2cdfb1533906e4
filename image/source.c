/* Image sources (image/source.h). */
#include "image/source.h"

#include "common/errmsg.h"
#include "image/rootfs_path.h"
#include "lifecycle/tree.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static int make_tmp(struct image_source *s, const char *what, char *err, size_t errlen)
{
	for (int i = 0; i < 16; i++) {
		uint32_t rnd = 0;
		if (getrandom(&rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
			return errmsg(err, errlen, -EIO,
				      "no random bytes for a work directory name");
		snprintf(s->tmp, sizeof(s->tmp), ".src-%s-%08x", what, rnd);
		if (mkdirat(s->workfd, s->tmp, 0700) == 0)
			return 0;
		if (errno != EEXIST)
			return errmsg(err, errlen, -errno, "cannot make a work directory: %s",
				      strerror(errno));
	}
	return errmsg(err, errlen, -EEXIST, "cannot make a work directory");
}

static int extract_file(struct archive *a, int pfd, const char *name, uint64_t size, uint64_t *left)
{
	if (size > *left)
		return -EFBIG;
	*left -= size;
	int fd = openat(pfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	const void *buf;
	size_t len;
	la_int64_t off;
	int r, ret = 0;
	while ((r = archive_read_data_block(a, &buf, &len, &off)) == ARCHIVE_OK) {
		if (off < 0 || (uint64_t)off + len > size) {
			ret = -EFBIG;
			break;
		}
		if (pwrite(fd, buf, len, off) != (ssize_t)len) {
			ret = -EIO;
			break;
		}
	}
	if (!ret && r != ARCHIVE_EOF)
		ret = -EIO;
	if (!ret && ftruncate(fd, (off_t)size) < 0)
		ret = -errno;
	close(fd);
	return ret;
}

/* An OCI archive or docker-archive (a tar, maybe compressed) into s->tmp. */
static int unpack_archive(const char *file, struct image_source *s, uint64_t max_bytes,
			  struct logger *log, char *err, size_t errlen)
{
	int r = make_tmp(s, "archive", err, errlen);
	if (r)
		return r;
	int rootfd = openat(s->workfd, s->tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (rootfd < 0)
		return errmsg(err, errlen, -errno, "work directory: %s", strerror(errno));
	struct archive *a = archive_read_new();
	if (!a) {
		close(rootfd);
		return -ENOMEM;
	}
	archive_read_support_filter_none(a);
	archive_read_support_filter_gzip(a);
	archive_read_support_filter_zstd(a);
	archive_read_support_filter_xz(a);
	archive_read_support_format_tar(a);
	archive_read_support_format_gnutar(a);
	if (archive_read_open_filename(a, file, 1 << 17) != ARCHIVE_OK) {
		r = errmsg(err, errlen, -EINVAL, "%.200s: not a tar archive: %s", file,
			   archive_error_string(a));
		archive_read_free(a);
		close(rootfd);
		return r;
	}
	struct archive_entry *e;
	uint64_t left = max_bytes, entries = 0, skipped = 0;
	int ar;
	while (!r && ((ar = archive_read_next_header(a, &e)) == ARCHIVE_OK || ar == ARCHIVE_WARN)) {
		char rel[ROOTFS_PATH_MAX], name[256];
		if (++entries > 1000000) {
			r = errmsg(err, errlen, -E2BIG, "%.200s: too many entries: refused", file);
			break;
		}
		r = rootfs_path_clean(archive_entry_pathname(e), rel, sizeof(rel), err, errlen);
		if (r || !*rel)
			continue;
		mode_t t = archive_entry_filetype(e);
		if ((t != AE_IFREG && t != AE_IFDIR) || archive_entry_hardlink(e)) {
			skipped++;
			continue;
		}
		int pfd = rootfs_open_parent(rootfd, rel, true, name, sizeof(name), err, errlen);
		if (pfd < 0) {
			r = pfd;
			break;
		}
		if (t == AE_IFDIR) {
			if (mkdirat(pfd, name, 0700) < 0 && errno != EEXIST)
				r = errmsg(err, errlen, -errno, "%.200s: %s", rel, strerror(errno));
		} else {
			int64_t sz = archive_entry_size(e);
			r = extract_file(a, pfd, name, sz > 0 ? (uint64_t)sz : 0, &left);
			if (r == -EFBIG)
				r = errmsg(err, errlen, r,
					   "%.200s: the archive unpacks to more than its cap "
					   "(--max-size): refused",
					   file);
			else if (r)
				r = errmsg(err, errlen, r, "%.200s in the archive: %s", rel,
					   strerror(-r));
		}
		close(pfd);
	}
	if (!r && ar != ARCHIVE_EOF)
		r = errmsg(err, errlen, -EINVAL, "%.200s: %s", file, archive_error_string(a));
	archive_read_free(a);
	if (!r && skipped && log)
		log_info(log, "%s: %llu links or special files in the archive itself skipped", file,
			 (unsigned long long)skipped);
	if (!r) {
		s->dfd = rootfd;
		return 0;
	}
	close(rootfd);
	return r;
}

static int run_skopeo(const char *ref, struct image_source *s, char *err, size_t errlen)
{
	int r = make_tmp(s, "storage", err, errlen);
	if (r)
		return r;
	char src[PATH_MAX + 32], dst[PATH_MAX + 64], dir[PATH_MAX];
	snprintf(src, sizeof(src), "containers-storage:%s", ref);
	snprintf(dir, sizeof(dir), "/proc/self/fd/%d/%s", s->workfd, s->tmp);
	char real[PATH_MAX];
	if (!realpath(dir, real))
		return errmsg(err, errlen, -errno, "work directory: %s", strerror(errno));
	snprintf(dst, sizeof(dst), "oci:%s/layout:cove", real);
	char *argv[] = {"skopeo", "copy", "--quiet", src, dst, NULL};
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, 2, 1); /* its chatter is not our stdout */
	pid_t pid;
	r = posix_spawnp(&pid, "skopeo", &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (r)
		return errmsg(err, errlen, -r,
			      "cannot run skopeo (containers-storage needs it): %s", strerror(r));
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -errno;
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		return errmsg(err, errlen, -EIO, "skopeo copy %s failed (its error is above)", src);
	snprintf(dir, sizeof(dir), "%s/layout", s->tmp);
	s->dfd = openat(s->workfd, dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	snprintf(s->want, sizeof(s->want), "cove");
	return s->dfd < 0 ? errmsg(err, errlen, -errno, "skopeo left no layout") : 0;
}

/* "TRANSPORT:PATH[:REF]" split; the path may not hold ':' then (as with skopeo). */
static void split_ref(char *rest, struct image_source *s)
{
	char *c = strchr(rest, ':');
	if (c) {
		*c = '\0';
		snprintf(s->want, sizeof(s->want), "%s", c + 1);
	}
}

int source_open(const char *spec, int workfd, uint64_t max_bytes, struct image_source *s,
		struct logger *log, char *err, size_t errlen)
{
	memset(s, 0, sizeof(*s));
	s->dfd = -1;
	s->workfd = workfd;
	if (!spec || !*spec || strlen(spec) >= PATH_MAX)
		return errmsg(err, errlen, -EINVAL, "no usable image source");
	snprintf(s->label, sizeof(s->label), "%s", spec);
	char path[PATH_MAX];
	const char *transport = NULL;
	static const char *const known[] = {
	    "oci:", "oci-archive:", "docker-archive:", "containers-storage:"};
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
		if (!strncmp(spec, known[i], strlen(known[i])))
			transport = known[i];
	snprintf(path, sizeof(path), "%s", transport ? spec + strlen(transport) : spec);
	if (transport && !strcmp(transport, "containers-storage:")) {
		snprintf(s->kind, sizeof(s->kind), "containers-storage");
		return run_skopeo(path, s, err, errlen);
	}
	if (transport)
		split_ref(path, s);
	struct stat st;
	if (stat(path, &st) < 0)
		return errmsg(err, errlen, -errno, "%.200s: %s", path, strerror(errno));
	if (S_ISDIR(st.st_mode)) {
		snprintf(s->kind, sizeof(s->kind), "%s",
			 transport && strcmp(transport, "oci:") ? "docker-dir" : "oci-layout");
		s->dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		return s->dfd < 0 ? errmsg(err, errlen, -errno, "%.200s: %s", path, strerror(errno))
				  : 0;
	}
	/* A block device holding an archive is one too (a large image handed over as a disk). */
	if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode))
		return errmsg(err, errlen, -EINVAL, "%.200s: neither a directory nor an archive",
			      path);
	int r = unpack_archive(path, s, max_bytes, log, err, errlen);
	if (!r)
		snprintf(s->kind, sizeof(s->kind), "%s",
			 faccessat(s->dfd, "index.json", F_OK, 0) == 0 ? "oci-archive"
								       : "docker-archive");
	return r;
}

void source_close(struct image_source *s)
{
	if (s->dfd >= 0)
		close(s->dfd);
	s->dfd = -1;
	if (s->tmp[0] && s->workfd >= 0)
		sbx_tree_remove(s->workfd, s->tmp);
	s->tmp[0] = '\0';
}
