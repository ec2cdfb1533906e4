/* zstd packing of a stopped sandbox's chain and overlays, and its checked unpacking. */
#include "lifecycle/archive.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/evp.h>
#include <zstd.h>

#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "common/file_io.h"
#include "common/hex.h"
#include "lifecycle/tree.h"
#include "lifecycle/vmm_args.h"

#define CHUNK	     (1u << 20)
#define TMP_DIR	     ".archive.tmp"
#define MANIFEST_MAX (8u << 20)

/* One stream through zstd: in -> out, with SHA-256 and a byte count of the plain side. */
struct pipe_io {
	void *in, *out;
	EVP_MD_CTX *md;
	uint64_t plain;
};

static int io_init(struct pipe_io *p)
{
	p->in = malloc(CHUNK);
	p->out = malloc(ZSTD_DStreamOutSize() > CHUNK ? ZSTD_DStreamOutSize() : CHUNK);
	p->md = EVP_MD_CTX_new();
	p->plain = 0;
	if (!p->in || !p->out || !p->md || !EVP_DigestInit_ex(p->md, EVP_sha256(), NULL))
		return -ENOMEM;
	return 0;
}

static void io_free(struct pipe_io *p)
{
	free(p->in);
	free(p->out);
	EVP_MD_CTX_free(p->md);
}

static void digest_hex(struct pipe_io *p, char hex[65])
{
	unsigned char d[32];
	unsigned int n = 0;

	EVP_DigestFinal_ex(p->md, d, &n);
	hex_encode(d, sizeof(d), hex);
}

/* Compresses the runs `ext` of fd `in` into fd `out`; *written gets the compressed size. */
static int compress_fd(struct pipe_io *p, int in, const struct file_run *ext, size_t next, int out,
		       uint64_t *written)
{
	ZSTD_CCtx *c = ZSTD_createCCtx();
	uint64_t woff = 0;
	size_t i = 0, done = 0; /* run, bytes of it read */
	int ret = 0;

	if (!c)
		return -ENOMEM;
	ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 3);
	for (bool last = false; !ret && !last;) {
		ssize_t n = 0;

		while (i < next && done == ext[i].len) {
			i++;
			done = 0;
		}
		if (i < next) {
			size_t want =
			    ext[i].len - done < CHUNK ? (size_t)(ext[i].len - done) : CHUNK;

			n = pread(in, p->in, want, (off_t)(ext[i].off + done));
			if (n <= 0) {
				ret = n < 0 ? -errno : -EIO; /* shrank under us */
				break;
			}
			done += (size_t)n;
		}
		last = i >= next;
		p->plain += (uint64_t)n;
		EVP_DigestUpdate(p->md, p->in, (size_t)n);
		ZSTD_inBuffer ib = {p->in, (size_t)n, 0};
		size_t left;

		do {
			ZSTD_outBuffer ob = {p->out, CHUNK, 0};

			left =
			    ZSTD_compressStream2(c, &ob, &ib, last ? ZSTD_e_end : ZSTD_e_continue);
			if (ZSTD_isError(left)) {
				ret = -EIO;
				break;
			}
			ret = pwrite_full(out, p->out, ob.pos, (off_t)woff);
			woff += ob.pos;
		} while (!ret && (last ? left != 0 : ib.pos < ib.size));
	}
	ZSTD_freeCCtx(c);
	*written = woff;
	return ret;
}

/* Where the next plain bytes of a stream go: run i of ext, `done` bytes into it. */
struct placer {
	const struct file_run *ext;
	size_t n, i;
	uint64_t done;
};

static int place(struct placer *pl, int out, const uint8_t *buf, size_t len)
{
	while (len) {
		while (pl->i < pl->n && pl->done == pl->ext[pl->i].len) {
			pl->i++;
			pl->done = 0;
		}
		if (pl->i >= pl->n)
			return -EFBIG;
		uint64_t room = pl->ext[pl->i].len - pl->done;
		size_t k = room < len ? (size_t)room : len;
		int ret = pwrite_full(out, buf, k, (off_t)(pl->ext[pl->i].off + pl->done));

		if (ret)
			return ret;
		pl->done += k;
		buf += k;
		len -= k;
	}
	return 0;
}

/* Decompresses fd `in` into the runs of fd `out`, refusing more than `cap` plain bytes. */
static int decompress_fd(struct pipe_io *p, int in, int out, struct placer *pl, uint64_t cap)
{
	ZSTD_DCtx *d = ZSTD_createDCtx();
	size_t outcap = ZSTD_DStreamOutSize() > CHUNK ? ZSTD_DStreamOutSize() : CHUNK;
	uint64_t off = 0;
	size_t hint = 1;
	int ret = 0;

	if (!d)
		return -ENOMEM;
	for (;;) {
		ssize_t n = pread(in, p->in, CHUNK, (off_t)off);

		if (n < 0) {
			ret = -errno;
			break;
		}
		if (n == 0) {
			ret = hint == 0 ? 0 : -EINVAL; /* a frame cut short */
			break;
		}
		off += (uint64_t)n;
		ZSTD_inBuffer ib = {p->in, (size_t)n, 0};

		/* A full output buffer can leave more inside zstd: go on until it is not full. */
		for (bool full = true; !ret && (ib.pos < ib.size || full);) {
			ZSTD_outBuffer ob = {p->out, outcap, 0};

			size_t before = ib.pos, r = ZSTD_decompressStream(d, &ob, &ib);

			if (ZSTD_isError(r)) {
				ret = -EINVAL;
				break;
			}
			/* A call that moved nothing after a frame ended would only announce the
			 * next frame: the end of this one stands. */
			if (ob.pos || ib.pos != before)
				hint = r;
			if (p->plain + ob.pos > cap) {
				ret = -EFBIG;
				break;
			}
			EVP_DigestUpdate(p->md, p->out, ob.pos);
			ret = place(pl, out, p->out, ob.pos);
			p->plain += ob.pos;
			full = ob.pos == ob.size;
		}
		if (ret)
			break;
	}
	ZSTD_freeDCtx(d);
	return ret;
}

bool sbx_archive_top_file(const char *n)
{
	size_t len = strlen(n);

	return !strncmp(n, "disk", 4) && dirfd_plain_name(n) &&
	       ((len > 4 && !strcmp(n + len - 4, ".ovl")) ||
		(len > 8 && !strcmp(n + len - 8, ".ovl.map")));
}

static json_t *extents_json(const struct file_run *e, size_t n)
{
	json_t *a = json_array();

	for (size_t i = 0; a && i < n; i++)
		json_array_append_new(
		    a, json_pack("[I,I]", (json_int_t)e[i].off, (json_int_t)e[i].len));
	return a;
}

static int pack_one(struct pipe_io *io, int srcdir, const char *name, uint64_t size, int adfd,
		    const char *area, json_t *list, struct sbx_archive_stats *st)
{
	char out_name[300], hex[65];
	struct file_run *ext = NULL;
	uint64_t written = 0;
	size_t next = 0;
	int in, out = -1, ret;

	if (io_init(io))
		return -ENOMEM;
	snprintf(out_name, sizeof(out_name), "%c-%s.zst", area[0], name);
	in = dirfd_open(srcdir, name, O_RDONLY | O_CLOEXEC);
	if (in < 0)
		return in;
	ret = file_data_runs(in, size, SBX_ARCHIVE_MAX_EXTENTS, &ext, &next);
	if (!ret)
		out = dirfd_create(adfd, out_name, O_WRONLY | O_CLOEXEC, 0600);
	ret = ret ?: out < 0 ? out : compress_fd(io, in, ext, next, out, &written);
	if (!ret && fsync(out) < 0)
		ret = -errno;
	close(in);
	if (out >= 0)
		close(out);
	if (!ret) {
		digest_hex(io, hex);
		json_array_append_new(list, json_pack("{s:s,s:s,s:I,s:I,s:o,s:s}", "area", area,
						      "name", name, "size", (json_int_t)size,
						      "data", (json_int_t)io->plain, "extents",
						      extents_json(ext, next), "sha256", hex));
		st->files++;
		st->bytes_in += io->plain;
		st->bytes_out += written;
	}
	free(ext);
	return ret;
}

/* Every regular file of one area: chain/ (all of it) or the sandbox directory (top_file). */
static int pack_area(int dfd, const char *area, int adfd, json_t *list,
		     struct sbx_archive_stats *st, char *err, size_t errlen)
{
	bool chain = !strcmp(area, "chain");
	int src = chain ? openat(dfd, SBX_CHAIN, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
			: dup(dfd);
	struct pipe_io io = {0};
	struct dirent *e;
	struct stat s;
	DIR *d;
	int ret = 0;

	if (src < 0)
		return errno == ENOENT && chain
			   ? errmsg(err, errlen, -ENOENT, "no snapshot chain to archive")
			   : -errno;
	d = fdopendir(src);
	if (!d) {
		close(src);
		return -errno;
	}
	while (!ret && (e = readdir(d))) {
		if (e->d_name[0] == '.' || (!chain && !sbx_archive_top_file(e->d_name)))
			continue;
		if (fstatat(src, e->d_name, &s, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(s.st_mode)) {
			ret = errmsg(err, errlen, -ENOTSUP, "%s/%s is not a regular file", area,
				     e->d_name);
			break;
		}
		ret = pack_one(&io, src, e->d_name, (uint64_t)s.st_size, adfd, area, list, st);
		io_free(&io);
		memset(&io, 0, sizeof(io));
		if (ret)
			errmsg(err, errlen, ret, "archiving %s/%s: %s", area, e->d_name,
			       strerror(-ret));
	}
	closedir(d);
	return ret;
}

static int write_manifest(int adfd, json_t *list)
{
	char *text = json_dumps(list, JSON_COMPACT);
	int fd, ret;

	if (!text)
		return -ENOMEM;
	fd = dirfd_create(adfd, SBX_ARCHIVE_MANIFEST, O_WRONLY | O_CLOEXEC, 0600);
	ret = fd < 0 ? fd : pwrite_full(fd, text, strlen(text), 0);
	if (fd >= 0) {
		if (!ret && fsync(fd) < 0)
			ret = -errno;
		close(fd);
	}
	free(text);
	return ret;
}

/* Removes what the archive now holds: chain/ and the top-level overlays. */
static void remove_packed(int dfd, json_t *list)
{
	size_t i;
	json_t *e;

	sbx_tree_remove(dfd, SBX_CHAIN);
	json_array_foreach(list, i,
			   e) if (!strcmp(json_string_value(json_object_get(e, "area")), "top"))
	    unlinkat(dfd, json_string_value(json_object_get(e, "name")), 0);
	dirfd_sync(dfd);
}

int sbx_archive_pack(int dfd, struct sbx_archive_stats *st, char *err, size_t errlen)
{
	json_t *list = json_array();
	int adfd, ret;

	memset(st, 0, sizeof(*st));
	if (!list)
		return -ENOMEM;
	/* A crash during an earlier pack left a partial copy: start again. */
	sbx_tree_remove(dfd, TMP_DIR);
	if (mkdirat(dfd, TMP_DIR, 0700) < 0) {
		json_decref(list);
		return errmsg(err, errlen, -errno, "archive: mkdir: %s", strerror(errno));
	}
	adfd = openat(dfd, TMP_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	ret = adfd < 0 ? -errno : 0;
	ret = ret ?: pack_area(dfd, "chain", adfd, list, st, err, errlen);
	ret = ret ?: pack_area(dfd, "top", adfd, list, st, err, errlen);
	if (!ret && (ret = write_manifest(adfd, list) ?: dirfd_sync(adfd)))
		errmsg(err, errlen, ret, "archive: manifest: %s", strerror(-ret));
	if (adfd >= 0)
		close(adfd);
	/* The rename is the commit point: before it the chain is whole, after it the archive. */
	if (!ret && (ret = dirfd_rename(dfd, TMP_DIR, SBX_ARCHIVE) ?: dirfd_sync(dfd)))
		errmsg(err, errlen, ret, "archive: rename: %s", strerror(-ret));
	if (ret)
		sbx_tree_remove(dfd, TMP_DIR);
	else
		remove_packed(dfd, list);
	json_decref(list);
	return ret;
}

/* An entry as the manifest gives it, checked before anything is written. */
struct entry {
	const char *area, *name, *sha;
	uint64_t size, data; /* the file's length; the bytes of its runs (the stream) */
	struct file_run *ext;
	size_t next;
};

static int extents_check(json_t *a, struct entry *x)
{
	uint64_t end = 0, sum = 0;
	size_t i;
	json_t *e;

	if (!json_is_array(a) || json_array_size(a) > SBX_ARCHIVE_MAX_EXTENTS)
		return -EINVAL;
	x->next = json_array_size(a);
	x->ext = calloc(x->next ? x->next : 1, sizeof(*x->ext));
	if (!x->ext)
		return -ENOMEM;
	json_array_foreach(a, i, e)
	{
		json_int_t off = json_integer_value(json_array_get(e, 0));
		json_int_t len = json_integer_value(json_array_get(e, 1));

		/* In order, apart, inside the file: each byte of the file written at most once. */
		if (json_array_size(e) != 2 || off < 0 || len <= 0 || (uint64_t)off < end ||
		    (uint64_t)len > x->size || (uint64_t)off > x->size - (uint64_t)len)
			return -EINVAL;
		x->ext[i] = (struct file_run){(uint64_t)off, (uint64_t)len};
		end = (uint64_t)(off + len);
		sum += (uint64_t)len;
	}
	return sum == x->data ? 0 : -EINVAL;
}

static int entry_check(json_t *e, struct entry *x)
{
	json_t *size = json_object_get(e, "size"), *data = json_object_get(e, "data");

	memset(x, 0, sizeof(*x));
	x->area = json_string_value(json_object_get(e, "area"));
	x->name = json_string_value(json_object_get(e, "name"));
	x->sha = json_string_value(json_object_get(e, "sha256"));
	if (!x->area || !x->name || !x->sha || !json_is_integer(size) || !json_is_integer(data) ||
	    json_integer_value(size) < 0 || json_integer_value(data) < 0 || strlen(x->sha) != 64 ||
	    strspn(x->sha, "0123456789abcdef") != 64 || strlen(x->name) > 250)
		return -EINVAL;
	x->size = (uint64_t)json_integer_value(size);
	x->data = (uint64_t)json_integer_value(data);
	if (x->size > SBX_ARCHIVE_MAX_FILE || x->data > x->size || !dirfd_plain_name(x->name))
		return -EINVAL;
	if (strcmp(x->area, "chain") && !(!strcmp(x->area, "top") && sbx_archive_top_file(x->name)))
		return -EINVAL;
	return extents_check(json_object_get(e, "extents"), x);
}

static int unpack_one(int adfd, int dst, const struct entry *x, struct sbx_archive_stats *st)
{
	struct placer pl = {.ext = x->ext, .n = x->next};
	struct pipe_io io = {0};
	char src[300], tmp[300], hex[65];
	int in, out, ret;

	snprintf(src, sizeof(src), "%c-%s.zst", x->area[0], x->name);
	snprintf(tmp, sizeof(tmp), ".%s.unpack", x->name);
	ret = io_init(&io);
	in = ret ? -ENOMEM : dirfd_open(adfd, src, O_RDONLY | O_CLOEXEC);
	out = in < 0 ? in : dirfd_create(dst, tmp, O_WRONLY | O_CLOEXEC, 0600);
	/* The holes stay holes: only the runs are written, then the length is set. */
	ret = out < 0 ? out : decompress_fd(&io, in, out, &pl, x->data);
	if (!ret && io.plain != x->data)
		ret = -EINVAL;
	if (!ret && ftruncate(out, (off_t)x->size) < 0)
		ret = -errno;
	if (!ret) {
		digest_hex(&io, hex);
		if (strcmp(hex, x->sha))
			ret = -EBADMSG;
	}
	if (!ret && fsync(out) < 0)
		ret = -errno;
	if (in >= 0)
		close(in);
	if (out >= 0)
		close(out);
	if (!ret)
		ret = dirfd_rename(dst, tmp, x->name);
	else if (out >= 0)
		dirfd_unlink(dst, tmp);
	st->files += !ret;
	st->bytes_out += ret ? 0 : io.plain;
	io_free(&io);
	return ret;
}

static json_t *read_manifest(int adfd)
{
	char *buf = malloc(MANIFEST_MAX + 1);
	int fd = dirfd_open(adfd, SBX_ARCHIVE_MANIFEST, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd < 0 || !buf ? -1 : pread(fd, buf, MANIFEST_MAX + 1, 0);
	json_t *j = NULL;

	if (fd >= 0)
		close(fd);
	if (n > 0 && n <= (ssize_t)MANIFEST_MAX) {
		buf[n] = '\0';
		j = json_loads(buf, 0, NULL);
	}
	free(buf);
	if (j && (!json_is_array(j) || json_array_size(j) > SBX_ARCHIVE_MAX_FILES)) {
		json_decref(j);
		j = NULL;
	}
	return j;
}

int sbx_archive_unpack(int dfd, struct sbx_archive_stats *st, char *err, size_t errlen)
{
	int adfd = openat(dfd, SBX_ARCHIVE, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	int cdfd = -1, ret = 0;
	json_t *list, *e;
	struct entry x = {0};
	size_t i;

	memset(st, 0, sizeof(*st));
	if (adfd < 0)
		return errmsg(err, errlen, -errno, "archive: %s", strerror(errno));
	list = read_manifest(adfd);
	if (!list) {
		close(adfd);
		return errmsg(err, errlen, -EINVAL, "archive: no valid %s", SBX_ARCHIVE_MANIFEST);
	}
	json_array_foreach(list, i, e)
	{
		if (!ret && entry_check(e, &x))
			ret = errmsg(err, errlen, -EINVAL,
				     "archive: manifest entry %zu is not valid", i);
		free(x.ext);
		x.ext = NULL;
	}
	/* The archive is the truth for an archived sandbox: a chain a crash left half-unpacked
	 * goes. */
	if (!ret) {
		sbx_tree_remove(dfd, SBX_CHAIN);
		if (mkdirat(dfd, SBX_CHAIN, 0700) < 0 ||
		    (cdfd = openat(dfd, SBX_CHAIN,
				   O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
			ret = errmsg(err, errlen, -errno, "archive: chain directory: %s",
				     strerror(errno));
	}
	json_array_foreach(list, i, e)
	{
		if (ret)
			break;
		entry_check(e, &x);
		st->bytes_in += x.data;
		ret = unpack_one(adfd, x.area[0] == 'c' ? cdfd : dfd, &x, st);
		free(x.ext);
		if (ret)
			errmsg(err, errlen, ret, "archive: %s/%s: %s", x.area, x.name,
			       ret == -EBADMSG ? "its SHA-256 does not match the manifest"
			       : ret == -EFBIG ? "larger than the manifest says"
					       : strerror(-ret));
	}
	if (!ret && (ret = dirfd_sync(cdfd) ?: dirfd_sync(dfd)))
		errmsg(err, errlen, ret, "archive: sync: %s", strerror(-ret));
	if (cdfd >= 0)
		close(cdfd);
	close(adfd);
	json_decref(list);
	if (!ret)
		sbx_tree_remove(dfd, SBX_ARCHIVE);
	return ret;
}
