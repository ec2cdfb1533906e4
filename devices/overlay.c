/* Copy-on-write overlay: chunk map, copy-up, synchronous I/O, and the crash-safe map update. */
#include "devices/overlay.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/byteorder.h"
#include "common/crc32.h"
#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "common/file_io.h"

static bool chunk_size_ok(uint32_t c)
{
	return c >= OVERLAY_CHUNK_MIN && c <= OVERLAY_CHUNK_MAX && (c & (c - 1)) == 0;
}

int overlay_map_parse(const uint8_t *buf, size_t len, struct overlay_map_info *out, char *err,
		      size_t errlen)
{
	memset(out, 0, sizeof(*out));
	if (len < OVERLAY_MAP_HDR_V1)
		return errmsg(err, errlen, -EINVAL, "truncated (%zu bytes, the header alone is %d)",
			      len, OVERLAY_MAP_HDR_V1);
	if (memcmp(buf, OVERLAY_MAP_MAGIC, 8))
		return errmsg(err, errlen, -EINVAL, "not a cove overlay map (bad magic)");
	uint32_t version = get_le32(buf + 8);
	if (version != 1 && version != OVERLAY_MAP_VERSION && version != OVERLAY_MAP_VERSION_SEALED)
		return errmsg(err, errlen, -EINVAL,
			      "unsupported version %u (this cove reads 1..%d)", version,
			      OVERLAY_MAP_VERSION_SEALED);
	size_t hdr = version == 1		      ? OVERLAY_MAP_HDR_V1
		     : version == OVERLAY_MAP_VERSION ? OVERLAY_MAP_HDR_SIZE
						      : OVERLAY_MAP_HDR_SEALED;
	if (len < hdr)
		return errmsg(err, errlen, -EINVAL,
			      "truncated (%zu bytes, the header alone is %zu)", len, hdr);
	if (crc32_update(0, buf, hdr - 4) != get_le32(buf + hdr - 4))
		return errmsg(err, errlen, -EINVAL, "header checksum mismatch (corrupted)");
	/* The fields every version has; v1 maps have no flags, depth or parent. */
	struct overlay_map_info m = {.version = version,
				     .chunk_size = get_le32(buf + 12),
				     .disk_size = get_le64(buf + 16),
				     .nr_chunks = get_le64(buf + 24)};
	if (version >= 2) {
		m.flags = get_le32(buf + 36);
		m.depth = get_le32(buf + 40);
		m.parent_crc = get_le32(buf + 44);
	}
	bool sealed = version == OVERLAY_MAP_VERSION_SEALED;
	if (m.flags & ~(OVERLAY_MAP_FROZEN | (sealed ? OVERLAY_MAP_SEALED : 0)))
		return errmsg(err, errlen, -EINVAL, "unknown flags 0x%x", m.flags);
	if (sealed && m.flags != (OVERLAY_MAP_FROZEN | OVERLAY_MAP_SEALED))
		return errmsg(err, errlen, -EINVAL,
			      "a version 3 map must be a sealed frozen layer");
	if (m.depth >= OVERLAY_CHAIN_MAX)
		return errmsg(err, errlen, -EINVAL, "layer depth %u is over the %d-layer cap",
			      m.depth, OVERLAY_CHAIN_MAX);
	if (m.depth == 0 && m.parent_crc)
		return errmsg(err, errlen, -EINVAL, "a layer on the base names a parent layer");
	if (!chunk_size_ok(m.chunk_size))
		return errmsg(err, errlen, -EINVAL, "bad chunk size %u", m.chunk_size);
	if (m.disk_size == 0 || m.disk_size > OVERLAY_DISK_MAX)
		return errmsg(err, errlen, -EINVAL, "bad disk size %llu",
			      (unsigned long long)m.disk_size);
	if (m.nr_chunks != (m.disk_size + m.chunk_size - 1) / m.chunk_size)
		return errmsg(err, errlen, -EINVAL, "chunk count %llu does not match the disk size",
			      (unsigned long long)m.nr_chunks);
	uint64_t bytes = (m.nr_chunks + 7) / 8;
	if (bytes > OVERLAY_BITMAP_MAX)
		return errmsg(err, errlen, -EINVAL, "bitmap of %llu bytes is over the %u byte cap",
			      (unsigned long long)bytes, OVERLAY_BITMAP_MAX);
	if (len != hdr + bytes)
		return errmsg(err, errlen, -EINVAL, "%s (%zu bytes, want %llu)",
			      len < hdr + bytes ? "truncated" : "trailing bytes", len,
			      (unsigned long long)(hdr + bytes));
	const uint8_t *bm = buf + hdr;
	if (crc32_update(0, bm, bytes) != get_le32(buf + 32))
		return errmsg(err, errlen, -EINVAL, "bitmap checksum mismatch (corrupted)");
	if (m.nr_chunks % 8 && (bm[bytes - 1] >> (m.nr_chunks % 8)))
		return errmsg(err, errlen, -EINVAL, "bits set past the last chunk");
	m.bitmap = bm;
	m.bitmap_bytes = bytes;
	if (sealed) {
		m.layer_id = get_le64(buf + 48);
		m.salt = buf + 56;
		m.chain_id = buf + 72;
		m.mac = buf + OVERLAY_MAP_MAC_OFF;
	}
	*out = m;
	return 0;
}

/* The header fields both map versions share: bytes 0..47 (magic to parent CRC). */
static void put_map_fields(const struct overlay *ov, uint8_t *buf, uint32_t version, uint32_t flags)
{
	memcpy(buf, OVERLAY_MAP_MAGIC, 8);
	put_le32(buf + 8, version);
	put_le32(buf + 12, ov->chunk_size);
	put_le64(buf + 16, ov->disk_size);
	put_le64(buf + 24, ov->nr_chunks);
	put_le32(buf + 32, crc32_update(0, ov->bitmap, ov->bitmap_bytes));
	put_le32(buf + 36, flags);
	put_le32(buf + 40, ov->depth);
	put_le32(buf + 44, ov->parent_crc);
}

int overlay_map_build(const struct overlay *ov, uint8_t **bufp, size_t *lenp)
{
	size_t len = OVERLAY_MAP_HDR_SIZE + ov->bitmap_bytes;
	uint8_t *buf = calloc(1, len);
	if (!buf)
		return -ENOMEM;
	put_map_fields(ov, buf, OVERLAY_MAP_VERSION, ov->frozen ? OVERLAY_MAP_FROZEN : 0);
	memcpy(buf + OVERLAY_MAP_HDR_SIZE, ov->bitmap, ov->bitmap_bytes);
	put_le32(buf + 48, crc32_update(0, buf, 48));
	*bufp = buf;
	*lenp = len;
	return 0;
}

bool overlay_chunk_allocated(const struct overlay *ov, uint64_t chunk)
{
	return chunk < ov->nr_chunks && (ov->bitmap[chunk / 8] >> (chunk % 8)) & 1;
}

static void set_allocated(struct overlay *ov, uint64_t chunk)
{
	ov->bitmap[chunk / 8] |= (uint8_t)(1u << (chunk % 8));
	ov->map_dirty = true;
}

/* Whole-buffer preadv/pwritev: retries EINTR and short transfers; consumes the iovec list. */
static int full_piov(int fd, bool write, struct iovec *v, int n, uint64_t len, uint64_t off)
{
	while (len) {
		ssize_t r = write ? pwritev(fd, v, n, (off_t)off) : preadv(fd, v, n, (off_t)off);
		if (r < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			return -errno;
		}
		if (r == 0 || (uint64_t)r > len)
			return -EIO;
		len -= (uint64_t)r;
		off += (uint64_t)r;
		size_t k = (size_t)r;
		while (k && n) {
			if (k < v->iov_len) {
				v->iov_base = (uint8_t *)v->iov_base + k;
				v->iov_len -= k;
				k = 0;
			} else {
				k -= v->iov_len;
				v++;
				n--;
			}
		}
	}
	return 0;
}

/* A position in a caller's iovec list. */
struct iov_cur {
	const struct iovec *iov;
	int niov;
	size_t skip; /* bytes of iov[0] already used */
};

/* Describes the next `n` bytes of the cursor in out[] (room for `max`); returns the count. */
static int iov_take(struct iov_cur *c, uint64_t n, struct iovec *out, int max)
{
	int k = 0;
	while (n) {
		if (!c->niov || k == max)
			return -EINVAL;
		size_t avail = c->iov->iov_len - c->skip;
		size_t t = avail < n ? avail : (size_t)n;
		if (t) {
			out[k++] = (struct iovec){(uint8_t *)c->iov->iov_base + c->skip, t};
			n -= t;
			c->skip += t;
		}
		if (c->skip == c->iov->iov_len) {
			c->iov++;
			c->niov--;
			c->skip = 0;
		}
	}
	return k;
}

static uint64_t chunk_len(const struct overlay *ov, uint64_t chunk)
{
	uint64_t start = chunk * ov->chunk_size;
	uint64_t left = ov->disk_size - start;
	return left < ov->chunk_size ? left : ov->chunk_size;
}

#define SRC_TOP	 (-1)
#define SRC_BASE (-2)

/* Where a chunk's current data lives: the top, the newest frozen layer holding it, or the base. */
static int chunk_src(const struct overlay *ov, uint64_t chunk)
{
	if (overlay_chunk_allocated(ov, chunk))
		return SRC_TOP;
	for (int i = ov->nr_layers - 1; i >= 0; i--)
		if ((ov->layers[i].bitmap[chunk / 8] >> (chunk % 8)) & 1)
			return i;
	return SRC_BASE;
}

static int src_fd(const struct overlay *ov, int src)
{
	return src == SRC_TOP	 ? ov->data_fd
	       : src == SRC_BASE ? ov->base_fd
				 : ov->layers[src].data_fd;
}

static bool src_sealed(const struct overlay *ov, int src)
{
	return src >= 0 && ov->layers[src].sealed;
}

/*
 * A whole chunk of a sealed layer, authenticated and decrypted into buf: the ciphertext at the
 * chunk's offset, its tag after the disk's bytes. A bad tag is an I/O error, never data.
 */
static int open_sealed_chunk(struct overlay *ov, const struct overlay_layer *l, uint64_t chunk,
			     uint8_t *buf)
{
	uint64_t clen = chunk_len(ov, chunk);
	uint8_t tag[OVERLAY_TAG_LEN];
	if (!l->sealer)
		return -EACCES;
	int r = pread_full(l->data_fd, buf, clen, chunk * ov->chunk_size);
	if (!r)
		r = pread_full(l->data_fd, tag, sizeof(tag),
			       ov->disk_size + chunk * OVERLAY_TAG_LEN);
	if (!r)
		r = l->sealer->open(l->sealer->opaque, l->chain_id, l->layer_id, l->salt, chunk,
				    buf, clen, buf, tag);
	if (r)
		memset(buf, 0, clen);
	return r;
}

/* Reads the chunk bytes [cstart + in_chunk, + n) from `src` into the iovecs. */
static int read_from(struct overlay *ov, int src, uint64_t chunk, uint64_t in_chunk,
		     struct iovec *v, int k, uint64_t n)
{
	if (!src_sealed(ov, src))
		return full_piov(src_fd(ov, src), false, v, k, n,
				 chunk * ov->chunk_size + in_chunk);
	if (!ov->open_buf) {
		ov->open_buf = malloc(ov->chunk_size);
		if (!ov->open_buf)
			return -ENOMEM;
	}
	int r = open_sealed_chunk(ov, &ov->layers[src], chunk, ov->open_buf);
	const uint8_t *p = ov->open_buf + in_chunk;
	for (int i = 0; !r && i < k; i++) {
		memcpy(v[i].iov_base, p, v[i].iov_len);
		p += v[i].iov_len;
	}
	return r;
}

/* A whole chunk as it reads now (a frozen layer, sealed or not, or the base) into buf. */
static int read_whole(struct overlay *ov, int src, uint64_t chunk, uint8_t *buf)
{
	if (src_sealed(ov, src))
		return open_sealed_chunk(ov, &ov->layers[src], chunk, buf);
	return pread_full(src_fd(ov, src), buf, chunk_len(ov, chunk), chunk * ov->chunk_size);
}

static int check_range(const struct overlay *ov, uint64_t off, const struct iovec *iov, int niov,
		       uint64_t len)
{
	if (off > ov->disk_size || len > ov->disk_size - off)
		return -EINVAL;
	uint64_t have = 0;
	for (int i = 0; i < niov; i++)
		have += iov[i].iov_len;
	return have < len ? -EINVAL : 0;
}

static int rw(struct overlay *ov, bool write, uint64_t off, const struct iovec *iov, int niov,
	      uint64_t len)
{
	int r = check_range(ov, off, iov, niov, len);
	if (r || len == 0)
		return r;
	struct iovec *tmp = malloc(sizeof(*tmp) * (size_t)niov);
	if (!tmp)
		return -ENOMEM;
	struct iov_cur cur = {iov, niov, 0};
	while (len) {
		uint64_t chunk = off / ov->chunk_size;
		uint64_t cstart = chunk * ov->chunk_size;
		uint64_t in_chunk = off - cstart;
		uint64_t clen = chunk_len(ov, chunk);
		uint64_t n = clen - in_chunk < len ? clen - in_chunk : len;
		int k = iov_take(&cur, n, tmp, niov);
		if (k < 0) {
			r = k;
			break;
		}
		bool alloc = overlay_chunk_allocated(ov, chunk);
		if (!write) {
			r = read_from(ov, chunk_src(ov, chunk), chunk, in_chunk, tmp, k, n);
		} else if (alloc || n == clen) {
			/* A whole chunk needs nothing from the base. */
			r = full_piov(ov->data_fd, true, tmp, k, n, off);
			if (!r && !alloc)
				set_allocated(ov, chunk);
		} else {
			/*
			 * Copy-up: the chunk as it reads now (frozen layer or base) + new bytes,
			 * written whole so the chunk is complete.
			 */
			r = read_whole(ov, chunk_src(ov, chunk), chunk, ov->chunk_buf);
			if (!r) {
				uint8_t *dst = ov->chunk_buf + in_chunk;
				for (int i = 0; i < k; i++) {
					memcpy(dst, tmp[i].iov_base, tmp[i].iov_len);
					dst += tmp[i].iov_len;
				}
				r = pwrite_full(ov->data_fd, ov->chunk_buf, clen, cstart);
			}
			if (!r) {
				set_allocated(ov, chunk);
				ov->copy_ups++;
			}
		}
		if (r)
			break;
		off += n;
		len -= n;
	}
	free(tmp);
	return r;
}

int overlay_read(struct overlay *ov, uint64_t off, const struct iovec *iov, int niov, uint64_t len)
{
	return rw(ov, false, off, iov, niov, len);
}

int overlay_write(struct overlay *ov, uint64_t off, const struct iovec *iov, int niov, uint64_t len)
{
	return rw(ov, true, off, iov, niov, len);
}

int overlay_write_zeroes(struct overlay *ov, uint64_t off, uint64_t len, bool unmap)
{
	if (off > ov->disk_size || len > ov->disk_size - off)
		return -EINVAL;
	if (len && !ov->zero_buf) {
		ov->zero_buf = calloc(1, ov->chunk_size);
		if (!ov->zero_buf)
			return -ENOMEM;
	}
	while (len) {
		uint64_t chunk = off / ov->chunk_size;
		uint64_t cstart = chunk * ov->chunk_size;
		uint64_t clen = chunk_len(ov, chunk);
		uint64_t n = clen - (off - cstart) < len ? clen - (off - cstart) : len;
		int r = -EOPNOTSUPP;
		if (unmap && n == clen) {
			/* A hole in the data file reads as zeros: the chunk is then allocated. */
			r = fallocate(ov->data_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				      (off_t)cstart, (off_t)clen) < 0
				? -errno
				: 0;
			if (!r && !overlay_chunk_allocated(ov, chunk))
				set_allocated(ov, chunk);
			if (r && r != -EOPNOTSUPP)
				return r;
		}
		if (r) {
			struct iovec iov = {ov->zero_buf, (size_t)n};
			r = rw(ov, true, off, &iov, 1, n);
			if (r)
				return r;
		}
		off += n;
		len -= n;
	}
	return 0;
}

/* fsync of the directory holding path (a rename in it is durable after this). */
static int fsync_parent(const char *path)
{
	char *dir = strdup(path);
	if (!dir)
		return -ENOMEM;
	int r = 0;
	int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		if (fsync(dfd) < 0)
			r = -errno;
		close(dfd);
	}
	free(dir);
	return r;
}

/* Replaces a map file with buf atomically: temp file, fsync, rename, fsync of the directory;
 * beneath the map's directory, never through a link planted there (dirfd_io.h). */
static int write_map_buf(const char *map_path, const uint8_t *buf, size_t len)
{
	char name[256], tmp[261];
	int dfd = dirfd_open_parent(map_path, name, sizeof(name));
	if (dfd < 0)
		return dfd;
	snprintf(tmp, sizeof(tmp), "%s.tmp", name);
	int r;
	int fd = dirfd_create(dfd, tmp, O_WRONLY, 0600);
	if (fd < 0) {
		r = fd;
		goto out;
	}
	r = pwrite_full(fd, buf, len, 0);
	if (!r && fsync(fd) < 0)
		r = -errno;
	if (close(fd) < 0 && !r)
		r = -errno;
	if (!r)
		r = dirfd_rename(dfd, tmp, name);
	if (r) {
		(void)dirfd_unlink(dfd, tmp);
		goto out;
	}
	r = dirfd_sync(dfd);
out:
	close(dfd);
	return r;
}

/*
 * Rewrites a map in place through its open fd, then syncs it. The map's length never changes for
 * a given disk, so the write covers the whole file; a torn write (power loss mid-write) fails the
 * map's CRCs at the next open, which is refused with one line, never read as a different map.
 */
static int write_map_fd(int fd, const uint8_t *buf, size_t len)
{
	struct stat st;
	int r = pwrite_full(fd, buf, len, 0);
	if (!r && fstat(fd, &st) < 0)
		r = -errno;
	if (!r && (uint64_t)st.st_size != len && ftruncate(fd, (off_t)len) < 0)
		r = -errno;
	if (!r && fdatasync(fd) < 0)
		r = -errno;
	return r;
}

/* Replaces the top's map file (see write_map_buf); *crc: the CRC-32 of what was written. */
static int write_map(struct overlay *ov, uint32_t *crc)
{
	uint8_t *buf;
	size_t len;
	int r = overlay_map_build(ov, &buf, &len);
	if (r)
		return r;
	if (crc)
		*crc = crc32_update(0, buf, len);
	r = ov->map_fd >= 0 ? write_map_fd(ov->map_fd, buf, len)
			    : write_map_buf(ov->map_path, buf, len);
	free(buf);
	return r;
}

int overlay_flush(struct overlay *ov)
{
	if (fdatasync(ov->data_fd) < 0)
		return -errno;
	if (!ov->map_dirty)
		return 0;
	int r = write_map(ov, NULL);
	if (!r)
		ov->map_dirty = false;
	return r;
}

static int read_map_file(int fd, uint8_t **bufp, size_t *lenp)
{
	struct stat st;
	if (fstat(fd, &st) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode))
		return -EINVAL;
	/* One byte over the cap is enough for the parser to say "trailing bytes". */
	uint64_t cap = OVERLAY_MAP_HDR_SIZE + (uint64_t)OVERLAY_BITMAP_MAX + 1;
	size_t len = (uint64_t)st.st_size < cap ? (size_t)st.st_size : (size_t)cap;
	uint8_t *buf = malloc(len ? len : 1);
	if (!buf)
		return -ENOMEM;
	size_t got = 0;
	while (got < len) {
		ssize_t r = pread(fd, buf + got, len - got, (off_t)got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int e = -errno;
			free(buf);
			return e;
		}
		if (r == 0)
			break;
		got += (size_t)r;
	}
	*bufp = buf;
	*lenp = got;
	return 0;
}

static char *map_path_of(const char *path)
{
	size_t plen = strlen(path);
	char *m = malloc(plen + sizeof(OVERLAY_MAP_SUFFIX));
	if (m) {
		memcpy(m, path, plen);
		memcpy(m + plen, OVERLAY_MAP_SUFFIX, sizeof(OVERLAY_MAP_SUFFIX));
	}
	return m;
}

/* Reads and parses a map file; -ENOENT (with a message) when it does not exist. */
static int load_map(const char *mpath, uint8_t **mbuf, size_t *mlen, struct overlay_map_info *info,
		    char *err, size_t errlen)
{
	int fd = open(mpath, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errmsg(err, errlen, -errno, "overlay map %s: %s", mpath, strerror(errno));
	int r = read_map_file(fd, mbuf, mlen);
	close(fd);
	if (r)
		return errmsg(err, errlen, r, "overlay map %s: %s", mpath, strerror(-r));
	char why[160];
	r = overlay_map_parse(*mbuf, *mlen, info, why, sizeof(why));
	if (r) {
		free(*mbuf);
		*mbuf = NULL;
		return errmsg(err, errlen, r, "overlay map %s: %s", mpath, why);
	}
	return 0;
}

/* Checks that a parsed map is layer `i` of this chain, on the layer whose map CRC is `parent`. */
static int check_layer(const struct overlay *ov, const char *base,
		       const struct overlay_map_info *info, int i, uint32_t parent, bool frozen,
		       char *err, size_t errlen)
{
	const char *m = ov->map_path;
	if (info->disk_size != ov->disk_size)
		return errmsg(
		    err, errlen, -EINVAL,
		    "overlay map %s was made for a %llu-byte disk but base %s is %llu bytes", m,
		    (unsigned long long)info->disk_size, base, (unsigned long long)ov->disk_size);
	if (i > 0 && info->chunk_size != ov->chunk_size)
		return errmsg(err, errlen, -EINVAL,
			      "overlay map %s has %u-byte chunks, the layer below %u-byte ones", m,
			      info->chunk_size, ov->chunk_size);
	if (info->depth != (uint32_t)i)
		return errmsg(err, errlen, -EINVAL,
			      "overlay map %s is layer %u of its chain but was given as layer %d",
			      m, info->depth, i);
	if (info->parent_crc != parent)
		return errmsg(
		    err, errlen, -EINVAL,
		    "overlay map %s was made on another parent layer (parent map checksum "
		    "%08x, the layer below is %08x)",
		    m, info->parent_crc, parent);
	bool is_frozen = info->flags & OVERLAY_MAP_FROZEN;
	if (is_frozen != frozen)
		return errmsg(
		    err, errlen, -EINVAL,
		    is_frozen ? "overlay map %s is a frozen layer: it cannot be the writable top"
			      : "overlay map %s is not frozen: it cannot be a lower layer",
		    m);
	return 0;
}

/* Creates an empty writable top at `path` (depth and parent_crc already set in ov). */
/*
 * Creates or opens path's last component beneath an fd of its directory, never through a link
 * there: after start the process may create files only beneath a directory fd (seccomp). The
 * fd, or -1 with errno set.
 */
static int open_in_parent(const char *path, int flags, mode_t mode)
{
	char name[256];
	int dfd = dirfd_open_parent(path, name, sizeof(name));
	if (dfd < 0) {
		errno = -dfd;
		return -1;
	}
	int fd = openat(dfd, name, flags | O_NOFOLLOW | O_CLOEXEC, mode);
	int e = errno;
	close(dfd);
	errno = e;
	return fd;
}

static int create_top(struct overlay *ov, const char *path, uint32_t chunk_size, bool fresh,
		      char *err, size_t errlen)
{
	/*
	 * A data file left without a map (a crash before the first map write) holds no chunk
	 * anyone refers to, so it is reused as it is.
	 */
	ov->chunk_size = chunk_size;
	ov->nr_chunks = (ov->disk_size + chunk_size - 1) / chunk_size;
	ov->bitmap_bytes = (size_t)((ov->nr_chunks + 7) / 8);
	if (ov->bitmap_bytes > OVERLAY_BITMAP_MAX)
		return errmsg(err, errlen, -EINVAL, "overlay: disk too large for chunk size %u",
			      chunk_size);
	ov->bitmap = calloc(1, ov->bitmap_bytes);
	if (!ov->bitmap)
		return -ENOMEM;
	/*
	 * Never through a link: a chain or overlay directory may have been seeded with one. A
	 * freeze (fresh) makes new files only: the filter allows nothing else (SECCOMP.md).
	 */
	ov->data_fd = open_in_parent(path, O_RDWR | O_CREAT | (fresh ? O_EXCL : 0), 0600);
	if (ov->data_fd < 0)
		return errmsg(err, errlen, -errno, "overlay data %s: %s", path, strerror(errno));
	ov->map_fd = open_in_parent(ov->map_path, O_RDWR | O_CREAT | O_EXCL, 0600);
	if (ov->map_fd < 0)
		return errmsg(err, errlen, -errno, "overlay map %s: %s", ov->map_path,
			      strerror(errno));
	struct stat st;
	if (fstat(ov->data_fd, &st) < 0 || !S_ISREG(st.st_mode))
		return errmsg(err, errlen, -EINVAL, "overlay data %s: not a regular file", path);
	if ((uint64_t)st.st_size != ov->disk_size &&
	    ftruncate(ov->data_fd, (off_t)ov->disk_size) < 0)
		return errmsg(err, errlen, -errno, "overlay data %s: %s", path, strerror(errno));
	int r = write_map(ov, NULL);
	if (r)
		return errmsg(err, errlen, r, "overlay map %s: %s", ov->map_path, strerror(-r));
	ov->map_dirty = false;
	return 0;
}

/* Opens a layer's data file and checks it covers the disk. The fd, or -errno. */
static int open_data(const struct overlay *ov, const char *path, bool rw, char *err, size_t errlen)
{
	int fd = open(path, (rw ? O_RDWR : O_RDONLY) | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errmsg(err, errlen, -errno, "overlay data %s: %s (its map exists)", path,
			      strerror(errno));
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size < ov->disk_size) {
		close(fd);
		return errmsg(err, errlen, -EINVAL,
			      "overlay data %s: not a regular file of at least %llu bytes", path,
			      (unsigned long long)ov->disk_size);
	}
	return fd;
}

/*
 * Records a frozen layer's map path and, for a sealed layer, what authenticating and reading it
 * needs; a sealed layer's data file must also hold its tags. 0 or -errno with a message.
 */
static int sealed_layer_info(struct overlay *ov, struct overlay_layer *l,
			     const struct overlay_map_info *info, const uint8_t *mbuf, char *err,
			     size_t errlen)
{
	l->map_path = strdup(ov->map_path);
	if (!l->map_path)
		return -ENOMEM;
	if (!(info->flags & OVERLAY_MAP_SEALED))
		return 0;
	if (info->layer_id > 0xfffffffeULL)
		return errmsg(err, errlen, -EINVAL, "overlay map %s: layer id %llu out of range",
			      l->map_path, (unsigned long long)info->layer_id);
	l->sealed = true;
	l->layer_id = info->layer_id;
	memcpy(l->salt, info->salt, OVERLAY_SALT_LEN);
	memcpy(l->chain_id, info->chain_id, OVERLAY_CHAIN_ID_LEN);
	memcpy(l->hdr, mbuf, OVERLAY_MAP_MAC_OFF);
	memcpy(l->mac, info->mac, OVERLAY_MAC_LEN);
	struct stat st;
	if (fstat(l->data_fd, &st) < 0 ||
	    (uint64_t)st.st_size < ov->disk_size + info->nr_chunks * OVERLAY_TAG_LEN)
		return errmsg(err, errlen, -EINVAL,
			      "overlay map %s: its data file is too short to hold a sealed layer",
			      l->map_path);
	return 0;
}

int overlay_open_chain(struct overlay *ov, const char *base, const char *const *paths, int n,
		       uint32_t chunk_size, char *err, size_t errlen)
{
	memset(ov, 0, sizeof(*ov));
	ov->base_fd = ov->data_fd = ov->map_fd = -1;
	int r;
	uint8_t *mbuf = NULL;
	if (n < 1 || n > OVERLAY_CHAIN_MAX)
		return errmsg(err, errlen, -EINVAL, "overlay: a chain has 1 to %d layers, not %d",
			      OVERLAY_CHAIN_MAX, n);
	if (!chunk_size)
		chunk_size = OVERLAY_CHUNK_DEFAULT;
	if (!chunk_size_ok(chunk_size))
		return errmsg(err, errlen, -EINVAL, "overlay: bad chunk size %u", chunk_size);
	ov->base_fd = open(base, O_RDONLY | O_CLOEXEC);
	if (ov->base_fd < 0) {
		r = errmsg(err, errlen, -errno, "%s: %s", base, strerror(errno));
		goto fail;
	}
	struct stat st;
	if (fstat(ov->base_fd, &st) < 0 || (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode))) {
		r = errmsg(err, errlen, -EINVAL, "%s: not a regular file or block device", base);
		goto fail;
	}
	off_t end = lseek(ov->base_fd, 0, SEEK_END);
	if (end <= 0 || (uint64_t)end > OVERLAY_DISK_MAX) {
		r = errmsg(err, errlen, -EINVAL,
			   "%s: base size %lld is empty or over the 1 PiB cap", base,
			   (long long)end);
		goto fail;
	}
	ov->disk_size = (uint64_t)end;
	uint32_t parent = 0;
	for (int i = 0; i < n; i++) {
		bool top = i == n - 1;
		free(ov->map_path);
		free(mbuf);
		mbuf = NULL;
		ov->map_path = map_path_of(paths[i]);
		if (!ov->map_path) {
			r = -ENOMEM;
			goto fail;
		}
		struct overlay_map_info info;
		size_t mlen = 0;
		r = load_map(ov->map_path, &mbuf, &mlen, &info, err, errlen);
		if (r == -ENOENT && top) {
			ov->depth = (uint32_t)i;
			ov->parent_crc = parent;
			r = create_top(ov, paths[i], i ? ov->chunk_size : chunk_size, false, err,
				       errlen);
			if (r)
				goto fail;
			break;
		}
		if (r)
			goto fail;
		r = check_layer(ov, base, &info, i, parent, !top, err, errlen);
		if (r)
			goto fail;
		ov->chunk_size = info.chunk_size;
		ov->nr_chunks = info.nr_chunks;
		ov->bitmap_bytes = info.bitmap_bytes;
		uint8_t *bm = malloc(info.bitmap_bytes);
		if (!bm) {
			r = -ENOMEM;
			goto fail;
		}
		memcpy(bm, info.bitmap, info.bitmap_bytes);
		int fd = open_data(ov, paths[i], top, err, errlen);
		if (fd < 0) {
			free(bm);
			r = fd;
			goto fail;
		}
		if (top) {
			ov->bitmap = bm;
			ov->data_fd = fd;
			ov->map_fd = open(ov->map_path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
			if (ov->map_fd < 0) {
				r = errmsg(err, errlen, -errno, "overlay map %s: %s", ov->map_path,
					   strerror(errno));
				goto fail;
			}
			ov->depth = (uint32_t)i;
			ov->parent_crc = parent;
		} else {
			parent = crc32_update(0, mbuf, mlen);
			struct overlay_layer *l = &ov->layers[ov->nr_layers++];
			*l = (struct overlay_layer){.data_fd = fd, .bitmap = bm, .map_crc = parent};
			r = sealed_layer_info(ov, l, &info, mbuf, err, errlen);
			if (r)
				goto fail;
		}
	}
	ov->chunk_buf = malloc(ov->chunk_size);
	if (!ov->chunk_buf) {
		r = -ENOMEM;
		goto fail;
	}
	free(mbuf);
	return 0;
fail:
	if (r == -ENOMEM)
		errmsg(err, errlen, r, "overlay: out of memory");
	free(mbuf);
	ov->map_dirty = false;
	overlay_close(ov);
	return r;
}

int overlay_open(struct overlay *ov, const char *base, const char *path, uint32_t chunk_size,
		 char *err, size_t errlen)
{
	return overlay_open_chain(ov, base, &path, 1, chunk_size, err, errlen);
}

/* The top's data file path: its map path without ".map". malloc'd, or NULL. */
static char *top_data_path(const struct overlay *ov)
{
	return strndup(ov->map_path, strlen(ov->map_path) - strlen(OVERLAY_MAP_SUFFIX));
}

/*
 * Seals the top's allocated chunks into `tmp` (created, never followed): ciphertext at each
 * chunk's own offset, its tag at disk size + chunk * 16. Synced; the fd, or -errno.
 */
static int seal_top(struct overlay *ov, const char *tmp, const uint8_t salt[OVERLAY_SALT_LEN])
{
	int fd = open_in_parent(tmp, O_RDWR | O_CREAT | O_EXCL, 0600);
	if (fd < 0)
		return -errno;
	uint64_t size = ov->disk_size + ov->nr_chunks * OVERLAY_TAG_LEN;
	int r = ftruncate(fd, (off_t)size) < 0 ? -errno : 0;
	for (uint64_t c = 0; !r && c < ov->nr_chunks; c++) {
		if (!overlay_chunk_allocated(ov, c))
			continue;
		uint64_t clen = chunk_len(ov, c);
		uint8_t tag[OVERLAY_TAG_LEN];
		r = pread_full(ov->data_fd, ov->chunk_buf, clen, c * ov->chunk_size);
		if (!r)
			r = ov->sealer->seal(ov->sealer->opaque, ov->sealer->chain_id,
					     ov->seal_layer_id, salt, c, ov->chunk_buf, clen,
					     ov->chunk_buf, tag);
		if (!r)
			r = pwrite_full(fd, ov->chunk_buf, clen, c * ov->chunk_size);
		if (!r)
			r = pwrite_full(fd, tag, sizeof(tag), ov->disk_size + c * OVERLAY_TAG_LEN);
	}
	if (!r && fsync(fd) < 0)
		r = -errno;
	if (r) {
		close(fd);
		unlink(tmp);
		return r;
	}
	return fd;
}

/* The version 3 map of the top as a sealed frozen layer: layer id, salt, sealed digest. */
static int build_sealed_map(const struct overlay *ov, const uint8_t salt[OVERLAY_SALT_LEN],
			    uint8_t **bufp, size_t *lenp)
{
	size_t len = OVERLAY_MAP_HDR_SEALED + ov->bitmap_bytes;
	uint8_t *buf = calloc(1, len);
	if (!buf)
		return -ENOMEM;
	put_map_fields(ov, buf, OVERLAY_MAP_VERSION_SEALED,
		       OVERLAY_MAP_FROZEN | OVERLAY_MAP_SEALED);
	put_le64(buf + 48, ov->seal_layer_id);
	memcpy(buf + 56, salt, OVERLAY_SALT_LEN);
	memcpy(buf + 72, ov->sealer->chain_id, OVERLAY_CHAIN_ID_LEN);
	memcpy(buf + OVERLAY_MAP_HDR_SEALED, ov->bitmap, ov->bitmap_bytes);
	int r = ov->sealer->seal_map(ov->sealer->opaque, ov->sealer->chain_id, buf,
				     OVERLAY_MAP_MAC_OFF, buf + OVERLAY_MAP_HDR_SEALED,
				     ov->bitmap_bytes, buf + OVERLAY_MAP_MAC_OFF);
	if (r) {
		free(buf);
		return r;
	}
	put_le32(buf + OVERLAY_MAP_HDR_SEALED - 4,
		 crc32_update(0, buf, OVERLAY_MAP_HDR_SEALED - 4));
	*bufp = buf;
	*lenp = len;
	return 0;
}

/* What freezing needs to switch tops and, on failure, switch back. */
struct saved_top {
	int data_fd, map_fd;
	uint8_t *bitmap;
	char *map_path;
	uint32_t depth, parent_crc;
};

/* Makes the frozen top writable again after a failed freeze; the next flush fixes its map. */
static void restore_top(struct overlay *ov, const struct saved_top *t)
{
	if (ov->data_fd >= 0)
		close(ov->data_fd);
	if (ov->map_fd >= 0)
		close(ov->map_fd);
	/* A new top's files stay behind (nothing refers to them; the host removes them). */
	free(ov->bitmap);
	free(ov->map_path);
	ov->data_fd = t->data_fd;
	ov->map_fd = t->map_fd;
	ov->bitmap = t->bitmap;
	ov->map_path = t->map_path;
	ov->depth = t->depth;
	ov->parent_crc = t->parent_crc;
	ov->frozen = false;
	ov->map_dirty = true;
}

/* A new file beside the others, written whole and synced; never through a link. */
static int write_new_file(const char *path, const uint8_t *buf, size_t len)
{
	int fd = open_in_parent(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
	if (fd < 0)
		return -errno;
	int r = pwrite_full(fd, buf, len, 0);
	if (!r && fsync(fd) < 0)
		r = -errno;
	if (close(fd) < 0 && !r)
		r = -errno;
	return r;
}

int overlay_layer_path(const struct overlay *ov, int k, char *out, size_t cap)
{
	if (k < 0 || k >= ov->nr_layers || !ov->layers[k].map_path)
		return -ERANGE;
	const char *m = ov->layers[k].map_path;
	size_t n = strlen(m) - strlen(OVERLAY_MAP_SUFFIX);
	if (n >= cap)
		return -ENAMETOOLONG;
	memcpy(out, m, n);
	out[n] = 0;
	return 0;
}

/*
 * The frozen top becomes layer n: a plain top keeps its files (its map now says frozen), and the
 * layer reads them through a new read-only fd, so not even this process holds a way to write a
 * committed layer; a sealed one is written as new files, X-sealed.ovl and its map, and the plain
 * top is emptied (only the live top is ever in clear). No file is replaced or removed: the VMM's
 * filter allows neither (sandbox/SECCOMP.md).
 */
int overlay_freeze(struct overlay *ov, const char *path, char *err, size_t errlen)
{
	if (ov->nr_layers + 1 >= OVERLAY_CHAIN_MAX)
		return errmsg(err, errlen, -E2BIG, "overlay: the chain is at its %d-layer cap",
			      OVERLAY_CHAIN_MAX);
	char *mpath = map_path_of(path);
	if (!mpath)
		return errmsg(err, errlen, -ENOMEM, "overlay: out of memory");
	int r = 0;
	if (access(mpath, F_OK) == 0)
		r = errmsg(err, errlen, -EEXIST, "overlay map %s already exists", mpath);
	else if (errno != ENOENT)
		r = errmsg(err, errlen, -errno, "overlay map %s: %s", mpath, strerror(errno));
	else if (fdatasync(ov->data_fd) < 0)
		r = errmsg(err, errlen, -errno, "overlay: cannot sync the data file: %s",
			   strerror(errno));
	if (r) {
		free(mpath);
		return r;
	}
	bool sealed = ov->sealer != NULL;
	uint8_t salt[OVERLAY_SALT_LEN] = {0}, *mbuf = NULL;
	size_t mlen = 0;
	char *dpath = top_data_path(ov), *spath = NULL, *smap = NULL;
	int sealed_fd = -1, ro_fd = -1;
	if (!dpath) {
		free(mpath);
		return errmsg(err, errlen, -ENOMEM, "overlay: out of memory");
	}
	ov->frozen = true;
	if (sealed) {
		/* X.ovl's sealed copy is X-sealed.ovl (+ .map): new names, never a replacement. */
		size_t dl = strlen(dpath), sl = strlen(".ovl");
		size_t stem = dl > sl && !strcmp(dpath + dl - sl, ".ovl") ? dl - sl : dl;
		spath = malloc(stem + sizeof("-sealed.ovl"));
		smap = spath ? malloc(stem + sizeof("-sealed.ovl") + strlen(OVERLAY_MAP_SUFFIX))
			     : NULL;
		if (!smap) {
			r = -ENOMEM;
		} else {
			sprintf(spath, "%.*s-sealed.ovl", (int)stem, dpath);
			sprintf(smap, "%s%s", spath, OVERLAY_MAP_SUFFIX);
			static const uint8_t zero[OVERLAY_SALT_LEN];
			if (getrandom(salt, sizeof(salt), 0) != (ssize_t)sizeof(salt) ||
			    !memcmp(salt, zero, sizeof(salt)))
				r = -EIO;
		}
		if (!r) {
			sealed_fd = seal_top(ov, spath, salt);
			r = sealed_fd < 0 ? sealed_fd : 0;
		}
		if (!r)
			r = build_sealed_map(ov, salt, &mbuf, &mlen);
		if (!r)
			r = write_new_file(smap, mbuf, mlen);
		if (!r)
			r = fsync_parent(smap);
	} else {
		r = overlay_map_build(ov, &mbuf, &mlen);
		/* Data is durable; the map now says "frozen" and is never rewritten. */
		if (!r)
			r = ov->map_fd >= 0 ? write_map_fd(ov->map_fd, mbuf, mlen)
					    : write_map_buf(ov->map_path, mbuf, mlen);
		if (!r) {
			ro_fd = open(dpath, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
			r = ro_fd < 0 ? -errno : 0;
		}
	}
	if (r) {
		ov->frozen = false;
		if (sealed_fd >= 0)
			close(sealed_fd);
		if (ro_fd >= 0)
			close(ro_fd);
		/* A frozen map written in place goes back to unfrozen at the next flush. */
		ov->map_dirty = true;
		errmsg(err, errlen, r, "overlay: cannot %s the layer %s: %s",
		       sealed ? "seal" : "freeze", ov->map_path, strerror(-r));
		goto out;
	}
	ov->map_dirty = false;
	uint32_t crc = crc32_update(0, mbuf, mlen);
	struct saved_top t = {ov->data_fd,  ov->map_fd, ov->bitmap,
			      ov->map_path, ov->depth,	ov->parent_crc};
	ov->data_fd = ov->map_fd = -1;
	ov->bitmap = NULL;
	ov->map_path = mpath;
	mpath = NULL;
	ov->depth = t.depth + 1;
	ov->parent_crc = crc;
	ov->frozen = false;
	r = create_top(ov, path, ov->chunk_size, true, err, errlen);
	if (r) {
		if (r == -ENOMEM)
			errmsg(err, errlen, r, "overlay: out of memory");
		/* The old top stays writable; the next flush rewrites its map unfrozen. */
		restore_top(ov, &t);
		if (sealed_fd >= 0)
			close(sealed_fd);
		if (ro_fd >= 0)
			close(ro_fd);
		goto out;
	}
	char *layer_map = t.map_path;
	if (sealed) {
		/*
		 * The plain top's bytes go: only the live top is ever in clear. Should this
		 * fail, the files are still unreferenced once the chain commits, and the host's
		 * clean-up removes them.
		 */
		int tr = ftruncate(t.data_fd, 0) | (t.map_fd >= 0 ? ftruncate(t.map_fd, 0) : 0);
		(void)tr;
		close(t.data_fd);
		t.data_fd = sealed_fd;
		sealed_fd = -1;
		free(t.map_path);
		layer_map = smap;
		smap = NULL;
	} else {
		close(t.data_fd);
		t.data_fd = ro_fd;
		ro_fd = -1;
	}
	if (t.map_fd >= 0)
		close(t.map_fd);
	ov->layers[ov->nr_layers++] =
	    (struct overlay_layer){.data_fd = t.data_fd,
				   .bitmap = t.bitmap,
				   .map_crc = crc,
				   .sealed = sealed,
				   .layer_id = sealed ? ov->seal_layer_id : 0,
				   .sealer = ov->sealer,
				   .map_path = layer_map};
	if (sealed) {
		memcpy(ov->layers[ov->nr_layers - 1].salt, salt, sizeof(salt));
		memcpy(ov->layers[ov->nr_layers - 1].chain_id, ov->sealer->chain_id,
		       OVERLAY_CHAIN_ID_LEN);
	}
out:
	free(mpath);
	free(mbuf);
	free(dpath);
	free(spath);
	free(smap);
	return r;
}

int overlay_attach_sealer(struct overlay *ov, const struct overlay_sealer *s, char *err,
			  size_t errlen)
{
	for (int i = 0; i < ov->nr_layers; i++) {
		struct overlay_layer *l = &ov->layers[i];
		if (!l->sealed || l->sealer)
			continue;
		int r = s->check_map(s->opaque, l->chain_id, l->hdr, sizeof(l->hdr), l->bitmap,
				     ov->bitmap_bytes, l->mac);
		if (r)
			return errmsg(err, errlen, -EBADMSG,
				      "overlay map %s failed authentication (altered, or not this "
				      "chain's)",
				      l->map_path ? l->map_path : "?");
		l->sealer = s;
	}
	return 0;
}

void overlay_count_sealed(const struct overlay *ov, int *sealed, int *plain)
{
	*sealed = *plain = 0;
	for (int i = 0; i < ov->nr_layers; i++)
		(*(ov->layers[i].sealed ? sealed : plain))++;
}

int overlay_verify_sealed(struct overlay *ov, char *err, size_t errlen)
{
	uint8_t *buf = malloc(ov->chunk_size);
	if (!buf)
		return errmsg(err, errlen, -ENOMEM, "overlay: out of memory");
	int r = 0;
	for (int i = 0; i < ov->nr_layers && !r; i++) {
		const struct overlay_layer *l = &ov->layers[i];
		for (uint64_t c = 0; l->sealed && c < ov->nr_chunks && !r; c++) {
			if (!((l->bitmap[c / 8] >> (c % 8)) & 1))
				continue;
			r = open_sealed_chunk(ov, l, c, buf);
			const char *mp = l->map_path ? l->map_path : "?";
			int plen =
			    (int)(strlen(mp) > 4 ? strlen(mp) - 4 : strlen(mp)); /* no ".map" */
			if (r)
				errmsg(err, errlen, r,
				       "overlay layer %.*s: chunk %llu failed authentication%s",
				       plen, mp, (unsigned long long)c,
				       r == -EBADMSG ? " (altered data or tag)" : "");
		}
	}
	free(buf);
	return r;
}

int overlay_close(struct overlay *ov)
{
	int r = 0;
	if (ov->data_fd >= 0 && ov->bitmap)
		r = overlay_flush(ov);
	if (ov->data_fd >= 0)
		close(ov->data_fd);
	if (ov->base_fd >= 0)
		close(ov->base_fd);
	if (ov->map_fd >= 0)
		close(ov->map_fd);
	ov->data_fd = ov->base_fd = ov->map_fd = -1;
	for (int i = 0; i < ov->nr_layers; i++) {
		close(ov->layers[i].data_fd);
		free(ov->layers[i].bitmap);
		free(ov->layers[i].map_path);
	}
	ov->nr_layers = 0;
	free(ov->open_buf);
	ov->open_buf = NULL;
	free(ov->bitmap);
	free(ov->map_path);
	free(ov->chunk_buf);
	free(ov->zero_buf);
	ov->bitmap = NULL;
	ov->map_path = NULL;
	ov->chunk_buf = NULL;
	ov->zero_buf = NULL;
	return r;
}
