/*
 * Layers through libarchive's reader, written by hand beneath the root: libarchive's own
 * extraction would resolve paths through whatever links earlier entries made. Two passes over
 * the blob: the whiteouts (which hide what the layers below put there), then the entries
 * (whiteouts never hide their own layer's files, whatever the order in the tar).
 */
#include "image/unpack.h"

#include "common/errmsg.h"
#include "image/rootfs_path.h"
#include "lifecycle/tree.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#define READ_CHUNK (128 * 1024)
#define WH_PREFIX  ".wh."
#define WH_OPAQUE  ".wh..wh..opq"

struct reader {
	const struct layer_src *src;
	uint64_t off;
	struct sha256_stream sh;
	int err; /* -EFBIG: more bytes than declared; -EIO */
	char buf[READ_CHUNK];
};

static la_ssize_t reader_read(struct archive *a, void *p, const void **out)
{
	struct reader *r = p;
	ssize_t n = pread(r->src->fd, r->buf, sizeof(r->buf), (off_t)r->off);
	if (n < 0) {
		r->err = -errno;
		archive_set_error(a, errno, "read failed");
		return -1;
	}
	if (r->off + (uint64_t)n > r->src->size) {
		r->err = -EFBIG;
		archive_set_error(a, EFBIG, "more bytes than declared");
		return -1;
	}
	r->off += (uint64_t)n;
	sha256_add(&r->sh, r->buf, (size_t)n);
	*out = r->buf;
	return n;
}

/* What libarchive left unread (padding after the end of the tar) still counts. */
static int reader_finish(struct reader *r, char *err, size_t errlen)
{
	for (;;) {
		ssize_t n = pread(r->src->fd, r->buf, sizeof(r->buf), (off_t)r->off);
		if (n < 0)
			return errmsg(err, errlen, -errno, "layer %d: read failed: %s",
				      r->src->index, strerror(errno));
		if (n == 0)
			break;
		if (r->off + (uint64_t)n > r->src->size)
			return errmsg(err, errlen, -EFBIG,
				      "layer %d is bigger than its declared %llu bytes: refused",
				      r->src->index, (unsigned long long)r->src->size);
		r->off += (uint64_t)n;
		sha256_add(&r->sh, r->buf, (size_t)n);
	}
	char hex[DIGEST_HEX + 1];
	int rc = sha256_end(&r->sh, hex);
	if (rc)
		return errmsg(err, errlen, rc, "layer %d: SHA-256 failed", r->src->index);
	if (r->off != r->src->size)
		return errmsg(err, errlen, -EINVAL,
			      "layer %d has %llu bytes, its descriptor says %llu: refused",
			      r->src->index, (unsigned long long)r->off,
			      (unsigned long long)r->src->size);
	if (strcmp(hex, r->src->hex) != 0)
		return errmsg(err, errlen, -EBADMSG,
			      "layer %d's digest is sha256:%.12s..., its descriptor says "
			      "sha256:%.12s...: refused",
			      r->src->index, hex, r->src->hex);
	return 0;
}

static struct archive *reader_open(struct reader *r, char *err, size_t errlen)
{
	r->off = 0;
	r->err = 0;
	if (sha256_begin(&r->sh)) {
		errmsg(err, errlen, -ENOMEM, "out of memory");
		return NULL;
	}
	struct archive *a = archive_read_new();
	if (!a) {
		sha256_abort(&r->sh);
		errmsg(err, errlen, -ENOMEM, "out of memory");
		return NULL;
	}
	/* Only built-in filters: archive_read_support_filter_all would run external programs. */
	archive_read_support_filter_none(a);
	archive_read_support_filter_gzip(a);
	archive_read_support_filter_zstd(a);
	archive_read_support_filter_xz(a);
	archive_read_support_filter_bzip2(a);
	archive_read_support_format_tar(a);
	archive_read_support_format_gnutar(a);
	if (archive_read_open(a, r, NULL, reader_read, NULL) != ARCHIVE_OK) {
		if (r->err == -EFBIG)
			errmsg(err, errlen, -EFBIG,
			       "layer %d is bigger than its declared %llu bytes: refused",
			       r->src->index, (unsigned long long)r->src->size);
		else
			errmsg(err, errlen, r->err ? r->err : -EINVAL, "layer %d is not a tar: %s",
			       r->src->index, archive_error_string(a));
		if (!r->err)
			r->err = -EINVAL;
		archive_read_free(a);
		sha256_abort(&r->sh);
		return NULL;
	}
	return a;
}

/* err already holds a line about the entry: put the layer's number in front of it. */
static int layer_err(char *err, size_t errlen, int r, int index)
{
	char line[512];
	snprintf(line, sizeof(line), "%s", errlen ? err : "");
	return errmsg(err, errlen, r, "layer %d: %s", index, line);
}

static const char *base_of(const char *rel)
{
	const char *s = strrchr(rel, '/');
	return s ? s + 1 : rel;
}

/* Everything in the directory `dfd` (O_PATH) goes: an opaque whiteout. */
static int empty_dir(int dfd)
{
	int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -ENOMEM;
	}
	int ret = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		int r = sbx_tree_remove(dirfd(d), de->d_name);
		if (r && !ret)
			ret = r;
	}
	closedir(d);
	return ret;
}

static int whiteout(int rootfd, const char *rel, struct unpack_stats *st, int index, char *err,
		    size_t errlen)
{
	char name[256];
	int pfd = rootfs_open_parent(rootfd, rel, false, name, sizeof(name), err, errlen);
	if (pfd == -ENOENT)
		return 0; /* nothing below to hide */
	if (pfd < 0)
		return layer_err(err, errlen, pfd, index);
	int r = 0;
	if (!strcmp(name, WH_OPAQUE)) {
		st->opaque++;
		r = empty_dir(pfd);
	} else {
		const char *victim = name + strlen(WH_PREFIX);
		st->whiteouts++;
		if (*victim && strcmp(victim, ".") && strcmp(victim, ".."))
			r = sbx_tree_remove(pfd, victim);
	}
	close(pfd);
	if (r && r != -ENOENT)
		return errmsg(err, errlen, r, "layer %d: whiteout '%.200s': %s", index, rel,
			      strerror(-r));
	return 0;
}

static bool xattr_kept(const char *name)
{
	return !strncmp(name, "user.", 5) || !strcmp(name, "security.capability");
}

static void set_xattrs(int fd, struct archive_entry *e, struct unpack_stats *st)
{
	const char *name;
	const void *val;
	size_t len;
	archive_entry_xattr_reset(e);
	while (archive_entry_xattr_next(e, &name, &val, &len) == ARCHIVE_OK) {
		if (xattr_kept(name) && len <= 65536 && fsetxattr(fd, name, val, len, 0) == 0)
			st->xattrs_kept++;
		else
			st->xattrs_skipped++;
	}
}

static int owner_of(struct archive_entry *e, uid_t *uid, gid_t *gid)
{
	int64_t u = archive_entry_uid(e), g = archive_entry_gid(e);
	if (u < 0 || g < 0 || u > 0xfffffffeLL || g > 0xfffffffeLL)
		return -EINVAL;
	*uid = (uid_t)u;
	*gid = (gid_t)g;
	return 0;
}

/* A file's bytes, written where libarchive says they go (holes stay holes). */
static int write_data(struct archive *a, int fd, uint64_t size)
{
	const void *buf;
	size_t len;
	la_int64_t off;
	int r;
	while ((r = archive_read_data_block(a, &buf, &len, &off)) == ARCHIVE_OK) {
		if (off < 0 || (uint64_t)off + len > size)
			return -EFBIG;
		const char *p = buf;
		while (len) {
			ssize_t n = pwrite(fd, p, len, off);
			if (n < 0) {
				if (errno == EINTR)
					continue;
				return -errno;
			}
			p += n;
			len -= (size_t)n;
			off += n;
		}
	}
	if (r != ARCHIVE_EOF)
		return -EIO;
	return ftruncate(fd, (off_t)size) < 0 ? -errno : 0;
}

struct entry_ctx {
	struct archive *a;
	struct archive_entry *e;
	int rootfd, index;
	struct unpack_budget *b;
	struct unpack_stats *st;
	char *err;
	size_t errlen;
};

static int put_file(struct entry_ctx *c, int pfd, const char *name, const char *rel)
{
	uint64_t size = archive_entry_size_is_set(c->e) && archive_entry_size(c->e) > 0
			    ? (uint64_t)archive_entry_size(c->e)
			    : 0;
	if (size > c->b->bytes_left)
		return errmsg(c->err, c->errlen, -EFBIG,
			      "layer %d: '%.200s' takes the image past its size cap (--max-size): "
			      "refused (a decompression bomb?)",
			      c->index, rel);
	c->b->bytes_left -= size;
	int fd = openat(pfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return errmsg(c->err, c->errlen, -errno, "layer %d: '%.200s': %s", c->index, rel,
			      strerror(errno));
	int r = write_data(c->a, fd, size);
	if (r == -EFBIG)
		r = errmsg(c->err, c->errlen, r,
			   "layer %d: '%.200s' holds more bytes than its header says: refused",
			   c->index, rel);
	else if (r == -EIO)
		r = errmsg(c->err, c->errlen, r, "layer %d: '%.200s': %s", c->index, rel,
			   archive_error_string(c->a));
	else if (r)
		r = errmsg(c->err, c->errlen, r, "layer %d: '%.200s': %s", c->index, rel,
			   strerror(-r));
	uid_t uid;
	gid_t gid;
	if (!r && owner_of(c->e, &uid, &gid) == 0 && fchown(fd, uid, gid) < 0)
		r = errmsg(c->err, c->errlen, -errno, "layer %d: '%.200s': chown: %s", c->index,
			   rel, strerror(errno));
	if (!r && fchmod(fd, archive_entry_perm(c->e) & 07777) < 0)
		r = errmsg(c->err, c->errlen, -errno, "layer %d: '%.200s': chmod: %s", c->index,
			   rel, strerror(errno));
	if (!r)
		set_xattrs(fd, c->e, c->st);
	close(fd);
	c->st->files++;
	c->st->bytes += size;
	return r;
}

static int put_dir(struct entry_ctx *c, int pfd, const char *name, const char *rel)
{
	if (mkdirat(pfd, name, 0755) < 0 && errno != EEXIST)
		return errmsg(c->err, c->errlen, -errno, "layer %d: '%.200s': %s", c->index, rel,
			      strerror(errno));
	int fd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errmsg(c->err, c->errlen, -errno, "layer %d: '%.200s': %s", c->index, rel,
			      strerror(errno));
	uid_t uid;
	gid_t gid;
	int r = 0;
	if (owner_of(c->e, &uid, &gid) == 0 && fchown(fd, uid, gid) < 0)
		r = -errno;
	if (!r && fchmod(fd, archive_entry_perm(c->e) & 07777) < 0)
		r = -errno;
	if (!r)
		set_xattrs(fd, c->e, c->st);
	close(fd);
	c->st->dirs++;
	return r ? errmsg(c->err, c->errlen, r, "layer %d: '%.200s': %s", c->index, rel,
			  strerror(-r))
		 : 0;
}

static int put_symlink(struct entry_ctx *c, int pfd, const char *name, const char *rel)
{
	const char *target = archive_entry_symlink(c->e);
	if (!target || !*target || strlen(target) >= ROOTFS_PATH_MAX)
		return errmsg(c->err, c->errlen, -EINVAL,
			      "layer %d: symlink '%.200s' has no usable target", c->index, rel);
	/* Kept as written, absolute or pointing outside: it is resolved in the guest, never here.
	 */
	if (symlinkat(target, pfd, name) < 0)
		return errmsg(c->err, c->errlen, -errno, "layer %d: '%.200s': %s", c->index, rel,
			      strerror(errno));
	uid_t uid;
	gid_t gid;
	if (owner_of(c->e, &uid, &gid) == 0)
		(void)fchownat(pfd, name, uid, gid, AT_SYMLINK_NOFOLLOW);
	c->st->symlinks++;
	return 0;
}

static int put_hardlink(struct entry_ctx *c, int pfd, const char *name, const char *rel,
			const char *to)
{
	char trel[ROOTFS_PATH_MAX], tname[256];
	int r = rootfs_path_clean(to, trel, sizeof(trel), c->err, c->errlen);
	if (r)
		return layer_err(c->err, c->errlen, r, c->index);
	if (!*trel)
		return errmsg(c->err, c->errlen, -EINVAL,
			      "layer %d: hard link '%.200s' to the root", c->index, rel);
	int tfd =
	    rootfs_open_parent(c->rootfd, trel, false, tname, sizeof(tname), c->err, c->errlen);
	if (tfd < 0)
		return layer_err(c->err, c->errlen, tfd, c->index);
	struct stat s;
	bool there = fstatat(tfd, tname, &s, AT_SYMLINK_NOFOLLOW) == 0;
	if (!there || S_ISDIR(s.st_mode)) {
		close(tfd);
		return errmsg(c->err, c->errlen, there ? -EISDIR : -ENOENT,
			      "layer %d: hard link '%.200s' to '%.200s', which is %s", c->index,
			      rel, trel, there ? "a directory" : "not there");
	}
	/* linkat without AT_SYMLINK_FOLLOW: a link to a symlink links the symlink itself. */
	r = linkat(tfd, tname, pfd, name, 0) < 0 ? -errno : 0;
	close(tfd);
	if (r)
		return errmsg(c->err, c->errlen, r, "layer %d: hard link '%.200s': %s", c->index,
			      rel, strerror(-r));
	c->st->hardlinks++;
	return 0;
}

static int put_entry(struct entry_ctx *c)
{
	char rel[ROOTFS_PATH_MAX], name[256];
	int r =
	    rootfs_path_clean(archive_entry_pathname(c->e), rel, sizeof(rel), c->err, c->errlen);
	if (r)
		return layer_err(c->err, c->errlen, r, c->index);
	if (!*rel)
		return 0; /* the root itself: cove's root stays root's, 0755 */
	const char *base = base_of(rel);
	if (!strncmp(base, WH_PREFIX, strlen(WH_PREFIX)))
		return 0; /* applied in the first pass */
	if (!c->b->entries_left--)
		return errmsg(c->err, c->errlen, -E2BIG,
			      "layer %d: more entries than an image may have: refused", c->index);
	c->st->entries++;
	mode_t type = archive_entry_filetype(c->e);
	const char *hl = archive_entry_hardlink(c->e);
	if (!hl && type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK) {
		c->st->special++;
		return 0;
	}
	int pfd = rootfs_open_parent(c->rootfd, rel, true, name, sizeof(name), c->err, c->errlen);
	if (pfd < 0)
		return layer_err(c->err, c->errlen, pfd, c->index);
	struct stat s;
	if (fstatat(pfd, name, &s, AT_SYMLINK_NOFOLLOW) == 0 &&
	    !(S_ISDIR(s.st_mode) && type == AE_IFDIR && !hl)) {
		r = sbx_tree_remove(pfd, name);
		if (r) {
			close(pfd);
			return errmsg(c->err, c->errlen, r, "layer %d: cannot replace '%.200s': %s",
				      c->index, rel, strerror(-r));
		}
	}
	if (hl)
		r = put_hardlink(c, pfd, name, rel, hl);
	else if (type == AE_IFREG)
		r = put_file(c, pfd, name, rel);
	else if (type == AE_IFDIR)
		r = put_dir(c, pfd, name, rel);
	else
		r = put_symlink(c, pfd, name, rel);
	close(pfd);
	return r;
}

static int one_pass(int rootfd, const struct layer_src *src, bool whiteouts,
		    struct unpack_budget *b, struct unpack_stats *st, char *err, size_t errlen)
{
	struct reader *rd = calloc(1, sizeof(*rd));
	if (!rd)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	rd->src = src;
	struct archive *a = reader_open(rd, err, errlen);
	if (!a) {
		int r = rd->err ? rd->err : -ENOMEM;
		free(rd);
		return r;
	}
	struct entry_ctx c = {.a = a,
			      .rootfd = rootfd,
			      .index = src->index,
			      .b = b,
			      .st = st,
			      .err = err,
			      .errlen = errlen};
	int r = 0, ar;
	uint64_t seen = 0;
	while ((ar = archive_read_next_header(a, &c.e)) == ARCHIVE_OK || ar == ARCHIVE_WARN) {
		if (whiteouts) {
			char rel[ROOTFS_PATH_MAX];
			r = rootfs_path_clean(archive_entry_pathname(c.e), rel, sizeof(rel), err,
					      errlen);
			if (r) {
				layer_err(err, errlen, r, src->index);
				break;
			}
			if (++seen > b->entries_left) {
				r = errmsg(err, errlen, -E2BIG,
					   "layer %d: more entries than an image may have: refused",
					   src->index);
				break;
			}
			if (*rel && !strncmp(base_of(rel), WH_PREFIX, strlen(WH_PREFIX)) &&
			    strcmp(base_of(rel), ".wh..wh..plnk"))
				r = whiteout(rootfd, rel, st, src->index, err, errlen);
		} else {
			r = put_entry(&c);
		}
		if (r)
			break;
	}
	if (!r && ar != ARCHIVE_EOF) {
		if (rd->err == -EFBIG)
			r = errmsg(err, errlen, -EFBIG,
				   "layer %d is bigger than its declared %llu bytes: refused",
				   src->index, (unsigned long long)src->size);
		else
			r = errmsg(err, errlen, rd->err ? rd->err : -EINVAL,
				   "layer %d: not a readable tar: %s", src->index,
				   archive_error_string(a));
	}
	archive_read_free(a);
	if (!r)
		r = reader_finish(rd, err, errlen);
	else
		sha256_abort(&rd->sh);
	free(rd);
	return r;
}

int unpack_layer(int rootfd, const struct layer_src *src, struct unpack_budget *b,
		 struct unpack_stats *st, struct logger *log, char *err, size_t errlen)
{
	struct unpack_stats before = *st;
	int r = one_pass(rootfd, src, true, b, st, err, errlen);
	if (!r)
		r = one_pass(rootfd, src, false, b, st, err, errlen);
	if (!r && st->special > before.special && log)
		log_info(log, "layer %d: %llu device nodes, fifos or sockets skipped", src->index,
			 (unsigned long long)(st->special - before.special));
	return r;
}
