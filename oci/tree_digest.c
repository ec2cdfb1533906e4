/* A root directory's content digest (oci/tree_digest.h). */
#include "oci/tree_digest.h"

#include <errno.h>
#include <fcntl.h>
#include <fts.h>
#include <limits.h>
#include <search.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "common/errmsg.h"

#define TREE_TAG "cove-oci-root-v3"
#define READ_BUF (256 << 10)

struct walk {
	struct sha256_stream h;
	void *links; /* tsearch tree of struct link: files with more than one name */
	uint64_t ordinal;
	char *buf;
	const char *const *replaced;
	size_t nreplaced;
	char *err;
	size_t errlen;
};

struct link {
	dev_t dev;
	ino_t ino;
	uint64_t ordinal; /* of the entry that first named it */
};

static int link_cmp(const void *a, const void *b)
{
	const struct link *x = a, *y = b;
	if (x->dev != y->dev)
		return x->dev < y->dev ? -1 : 1;
	if (x->ino != y->ino)
		return x->ino < y->ino ? -1 : 1;
	return 0;
}

static int name_order(const FTSENT **a, const FTSENT **b)
{
	return strcmp((*a)->fts_name, (*b)->fts_name);
}

static void put_u64(struct walk *w, uint64_t v)
{
	unsigned char b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)(v >> (8 * i));
	sha256_add(&w->h, b, sizeof(b));
}

static void put_bytes(struct walk *w, const void *p, size_t n)
{
	put_u64(w, n);
	sha256_add(&w->h, p, n);
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The entry's extended attributes, by name in order. */
static int put_xattrs(struct walk *w, const char *path)
{
	ssize_t n = llistxattr(path, w->buf, OCI_XATTR_LIST_MAX);
	if (n < 0 && (errno == ENOTSUP || errno == ENODATA))
		n = 0;
	if (n < 0)
		return errmsg(w->err, w->errlen, -errno, "%s: attributes: %s", path,
			      strerror(errno));
	char *names = malloc((size_t)n + 1), *list[1024];
	size_t k = 0;
	if (!names)
		return -ENOMEM;
	memcpy(names, w->buf, (size_t)n);
	names[n] = '\0';
	for (char *p = names; p < names + n && *p; p += strlen(p) + 1) {
		if (k == sizeof(list) / sizeof(list[0])) {
			free(names);
			return errmsg(w->err, w->errlen, -E2BIG, "%s: more than %zu attributes",
				      path, k);
		}
		list[k++] = p;
	}
	qsort(list, k, sizeof(list[0]), cmp_names);
	put_u64(w, k);
	int r = 0;
	for (size_t i = 0; i < k && !r; i++) {
		ssize_t v = lgetxattr(path, list[i], w->buf, OCI_XATTR_VALUE_MAX);
		if (v < 0) {
			r = errmsg(w->err, w->errlen, -errno, "%s: attribute %.100s: %s", path,
				   list[i], strerror(errno));
			break;
		}
		put_bytes(w, list[i], strlen(list[i]));
		put_bytes(w, w->buf, (size_t)v);
	}
	free(names);
	return r;
}

/* A regular file's bytes, exactly st_size of them. */
static int put_content(struct walk *w, const char *path, const struct stat *st)
{
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOATIME);
	if (fd < 0 && errno == EPERM)
		fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errmsg(w->err, w->errlen, -errno, "%s: %s", path, strerror(errno));
	uint64_t left = (uint64_t)st->st_size;
	int r = 0;
	for (;;) {
		ssize_t n = read(fd, w->buf, READ_BUF);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = errmsg(w->err, w->errlen, -errno, "%s: %s", path, strerror(errno));
			break;
		}
		if ((uint64_t)n > left) {
			n = 0; /* grew: the same error as shrinking */
			left = 1;
		}
		if (n == 0) {
			if (left)
				r = errmsg(w->err, w->errlen, -EAGAIN,
					   "%s: changed while it was read", path);
			break;
		}
		sha256_add(&w->h, w->buf, (size_t)n);
		left -= (uint64_t)n;
	}
	close(fd);
	return r;
}

/* 1 and its first name's ordinal when the file was seen before under another name. */
static int hard_link(struct walk *w, const struct stat *st, uint64_t *first)
{
	struct link *l = malloc(sizeof(*l));
	if (!l)
		return -ENOMEM;
	*l = (struct link){.dev = st->st_dev, .ino = st->st_ino, .ordinal = w->ordinal};
	struct link **found = tsearch(l, &w->links, link_cmp);
	if (!found) {
		free(l);
		return -ENOMEM;
	}
	if (*found != l) {
		free(l);
		*first = (*found)->ordinal;
		return 1;
	}
	return 0;
}

static bool is_replaced(const struct walk *w, const char *rel)
{
	for (size_t i = 0; i < w->nreplaced; i++)
		if (!strcmp(w->replaced[i], rel))
			return true;
	return false;
}

static int put_entry(struct walk *w, FTSENT *e, size_t rootlen, struct oci_tree_sum *sum)
{
	const struct stat *st = e->fts_statp;
	const char *rel = e->fts_path + rootlen;
	int r;

	put_bytes(w, rel, strlen(rel));
	if (rel[0] && is_replaced(w, rel)) { /* a copied file goes over it: its type only */
		put_u64(w, st->st_mode & S_IFMT);
		w->ordinal++;
		return 0;
	}
	put_u64(w, st->st_mode);
	put_u64(w, st->st_uid);
	put_u64(w, st->st_gid);
	if (!S_ISDIR(st->st_mode) && !S_ISLNK(st->st_mode)) {
		put_u64(w, (uint64_t)st->st_mtim.tv_sec);
		put_u64(w, (uint64_t)st->st_mtim.tv_nsec);
	}
	if ((r = put_xattrs(w, e->fts_accpath)))
		return r;
	if (S_ISLNK(st->st_mode)) {
		ssize_t n = readlink(e->fts_accpath, w->buf, READ_BUF);
		if (n < 0)
			return errmsg(w->err, w->errlen, -errno, "%s: %s", e->fts_path,
				      strerror(errno));
		put_bytes(w, w->buf, (size_t)n);
	} else if (S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode)) {
		put_u64(w, major(st->st_rdev));
		put_u64(w, minor(st->st_rdev));
	} else if (S_ISREG(st->st_mode)) {
		uint64_t first = 0;
		if (st->st_nlink > 1 && (r = hard_link(w, st, &first)) < 0)
			return r;
		put_u64(w, r == 1 ? 1 : 0);
		if (r == 1) {
			put_u64(w, first);
		} else {
			put_u64(w, (uint64_t)st->st_size);
			sum->file_bytes += (uint64_t)st->st_size;
			sum->alloc_bytes += (uint64_t)st->st_blocks * 512;
			if ((r = put_content(w, e->fts_accpath, st)))
				return r;
		}
	}
	w->ordinal++;
	return 0;
}

int oci_tree_digest(const char *root, const char *const *replaced, size_t n,
		    struct oci_tree_sum *sum, char *err, size_t errlen)
{
	struct walk w = {.replaced = replaced, .nreplaced = n, .err = err, .errlen = errlen};
	char *paths[] = {(char *)root, NULL};
	size_t rootlen = strlen(root);
	FTSENT *e;
	FTS *f;
	int r = 0;

	memset(sum, 0, sizeof(*sum));
	if (!(w.buf = malloc(READ_BUF)))
		return -ENOMEM;
	if ((r = sha256_begin(&w.h))) {
		free(w.buf);
		return errmsg(err, errlen, r, "sha256: %s", strerror(-r));
	}
	sha256_add(&w.h, TREE_TAG, sizeof(TREE_TAG));
	if (!(f = fts_open(paths, FTS_PHYSICAL | FTS_NOCHDIR | FTS_XDEV, name_order))) {
		r = errmsg(err, errlen, -errno, "%s: %s", root, strerror(errno));
		goto out;
	}
	for (;;) {
		errno = 0;
		if (!(e = fts_read(f))) {
			if (errno)
				r = errmsg(err, errlen, -errno, "%s: %s", root, strerror(errno));
			break;
		}
		if (e->fts_info == FTS_DP)
			continue;
		if (e->fts_info == FTS_DNR || e->fts_info == FTS_ERR || e->fts_info == FTS_NS) {
			int en = e->fts_errno ? e->fts_errno : EIO;
			r = errmsg(err, errlen, -en, "%s: %s", e->fts_path, strerror(en));
			break;
		}
		if (e->fts_info == FTS_DC) {
			r = errmsg(err, errlen, -ELOOP, "%s: a directory loop", e->fts_path);
			break;
		}
		if (++sum->entries > OCI_TREE_ENTRIES_MAX) {
			r = errmsg(err, errlen, -E2BIG, "%s: more than %u entries", root,
				   OCI_TREE_ENTRIES_MAX);
			break;
		}
		if ((r = put_entry(&w, e, rootlen, sum)))
			break;
	}
	fts_close(f);
out:
	tdestroy(w.links, free);
	free(w.buf);
	if (r) {
		sha256_abort(&w.h);
		return r;
	}
	put_u64(&w, sum->entries);
	r = sha256_end(&w.h, sum->hex);
	return r ? errmsg(err, errlen, r, "sha256: %s", strerror(-r)) : 0;
}
