/* Copy-on-write overlay: chunk map, copy-up, synchronous I/O, and the crash-safe map update. */
#include "overlay.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(char *err, size_t errlen, int r, const char *fmt, ...)
{
	if (err && errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return r;
}

uint32_t overlay_crc32(uint32_t crc, const void *buf, size_t len)
{
	const uint8_t *p = buf;
	crc = ~crc;
	while (len--) {
		crc ^= *p++;
		for (int k = 0; k < 8; k++)
			crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1)));
	}
	return ~crc;
}

static uint32_t get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_le64(const uint8_t *p)
{
	return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32;
}

static void put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v)
{
	put_le32(p, (uint32_t)v);
	put_le32(p + 4, (uint32_t)(v >> 32));
}

static bool chunk_size_ok(uint32_t c)
{
	return c >= OVERLAY_CHUNK_MIN && c <= OVERLAY_CHUNK_MAX && (c & (c - 1)) == 0;
}

int overlay_map_parse(const uint8_t *buf, size_t len, struct overlay_map_info *out, char *err,
		      size_t errlen)
{
	memset(out, 0, sizeof(*out));
	if (len < OVERLAY_MAP_HDR_SIZE)
		return fail(err, errlen, -EINVAL, "truncated (%zu bytes, the header alone is %d)",
			    len, OVERLAY_MAP_HDR_SIZE);
	if (memcmp(buf, OVERLAY_MAP_MAGIC, 8))
		return fail(err, errlen, -EINVAL, "not a cove overlay map (bad magic)");
	uint32_t version = get_le32(buf + 8);
	if (version != OVERLAY_MAP_VERSION)
		return fail(err, errlen, -EINVAL, "unsupported version %u (this cove reads %d)",
			    version, OVERLAY_MAP_VERSION);
	if (overlay_crc32(0, buf, 36) != get_le32(buf + 36))
		return fail(err, errlen, -EINVAL, "header checksum mismatch (corrupted)");
	uint32_t chunk = get_le32(buf + 12);
	uint64_t disk = get_le64(buf + 16);
	uint64_t nr = get_le64(buf + 24);
	if (!chunk_size_ok(chunk))
		return fail(err, errlen, -EINVAL, "bad chunk size %u", chunk);
	if (disk == 0 || disk > OVERLAY_DISK_MAX)
		return fail(err, errlen, -EINVAL, "bad disk size %llu", (unsigned long long)disk);
	if (nr != (disk + chunk - 1) / chunk)
		return fail(err, errlen, -EINVAL, "chunk count %llu does not match the disk size",
			    (unsigned long long)nr);
	uint64_t bytes = (nr + 7) / 8;
	if (bytes > OVERLAY_BITMAP_MAX)
		return fail(err, errlen, -EINVAL, "bitmap of %llu bytes is over the %u byte cap",
			    (unsigned long long)bytes, OVERLAY_BITMAP_MAX);
	if (len != OVERLAY_MAP_HDR_SIZE + bytes)
		return fail(err, errlen, -EINVAL, "%s (%zu bytes, want %llu)",
			    len < OVERLAY_MAP_HDR_SIZE + bytes ? "truncated" : "trailing bytes",
			    len, (unsigned long long)(OVERLAY_MAP_HDR_SIZE + bytes));
	const uint8_t *bm = buf + OVERLAY_MAP_HDR_SIZE;
	if (overlay_crc32(0, bm, bytes) != get_le32(buf + 32))
		return fail(err, errlen, -EINVAL, "bitmap checksum mismatch (corrupted)");
	if (nr % 8 && (bm[bytes - 1] >> (nr % 8)))
		return fail(err, errlen, -EINVAL, "bits set past the last chunk");
	*out = (struct overlay_map_info){.version = version,
					 .chunk_size = chunk,
					 .disk_size = disk,
					 .nr_chunks = nr,
					 .bitmap = bm,
					 .bitmap_bytes = bytes};
	return 0;
}

int overlay_map_build(const struct overlay *ov, uint8_t **bufp, size_t *lenp)
{
	size_t len = OVERLAY_MAP_HDR_SIZE + ov->bitmap_bytes;
	uint8_t *buf = calloc(1, len);
	if (!buf)
		return -ENOMEM;
	memcpy(buf, OVERLAY_MAP_MAGIC, 8);
	put_le32(buf + 8, OVERLAY_MAP_VERSION);
	put_le32(buf + 12, ov->chunk_size);
	put_le64(buf + 16, ov->disk_size);
	put_le64(buf + 24, ov->nr_chunks);
	memcpy(buf + OVERLAY_MAP_HDR_SIZE, ov->bitmap, ov->bitmap_bytes);
	put_le32(buf + 32, overlay_crc32(0, ov->bitmap, ov->bitmap_bytes));
	put_le32(buf + 36, overlay_crc32(0, buf, 36));
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

/* Whole-buffer pread/pwrite: retries EINTR and short transfers; end of file is -EIO. */
static int full_pio(int fd, bool write, void *buf, size_t len, uint64_t off)
{
	uint8_t *p = buf;
	while (len) {
		ssize_t r = write ? pwrite(fd, p, len, (off_t)off) : pread(fd, p, len, (off_t)off);
		if (r < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			return -errno;
		}
		if (r == 0)
			return -EIO;
		p += r;
		len -= (size_t)r;
		off += (uint64_t)r;
	}
	return 0;
}

/* Same for an iovec list, which it consumes. */
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
			r = full_piov(alloc ? ov->data_fd : ov->base_fd, false, tmp, k, n, off);
		} else if (alloc || n == clen) {
			/* A whole chunk needs nothing from the base. */
			r = full_piov(ov->data_fd, true, tmp, k, n, off);
			if (!r && !alloc)
				set_allocated(ov, chunk);
		} else {
			/* Copy-up: base chunk + new bytes, written whole so the chunk is complete.
			 */
			r = full_pio(ov->base_fd, false, ov->chunk_buf, clen, cstart);
			if (!r) {
				uint8_t *dst = ov->chunk_buf + in_chunk;
				for (int i = 0; i < k; i++) {
					memcpy(dst, tmp[i].iov_base, tmp[i].iov_len);
					dst += tmp[i].iov_len;
				}
				r = full_pio(ov->data_fd, true, ov->chunk_buf, clen, cstart);
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

/* Replaces the map file atomically: temp file, fsync, rename, fsync of the directory. */
static int write_map(struct overlay *ov)
{
	uint8_t *buf;
	size_t len;
	int r = overlay_map_build(ov, &buf, &len);
	if (r)
		return r;
	size_t plen = strlen(ov->map_path);
	char *tmp = malloc(plen + 5);
	char *dir = strdup(ov->map_path);
	if (!tmp || !dir) {
		r = -ENOMEM;
		goto out;
	}
	memcpy(tmp, ov->map_path, plen);
	memcpy(tmp + plen, ".tmp", 5);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		r = -errno;
		goto out;
	}
	r = full_pio(fd, true, buf, len, 0);
	if (!r && fsync(fd) < 0)
		r = -errno;
	if (close(fd) < 0 && !r)
		r = -errno;
	if (!r && rename(tmp, ov->map_path) < 0)
		r = -errno;
	if (r) {
		unlink(tmp);
		goto out;
	}
	int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		if (fsync(dfd) < 0)
			r = -errno;
		close(dfd);
	}
out:
	free(dir);
	free(tmp);
	free(buf);
	return r;
}

int overlay_flush(struct overlay *ov)
{
	if (fdatasync(ov->data_fd) < 0)
		return -errno;
	if (!ov->map_dirty)
		return 0;
	int r = write_map(ov);
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

int overlay_open(struct overlay *ov, const char *base, const char *path, uint32_t chunk_size,
		 char *err, size_t errlen)
{
	memset(ov, 0, sizeof(*ov));
	ov->base_fd = ov->data_fd = -1;
	int r, map_fd = -1;
	uint8_t *mbuf = NULL;
	if (!chunk_size)
		chunk_size = OVERLAY_CHUNK_DEFAULT;
	if (!chunk_size_ok(chunk_size))
		return fail(err, errlen, -EINVAL, "overlay: bad chunk size %u", chunk_size);
	ov->base_fd = open(base, O_RDONLY | O_CLOEXEC);
	if (ov->base_fd < 0) {
		r = fail(err, errlen, -errno, "%s: %s", base, strerror(errno));
		goto fail;
	}
	struct stat st;
	if (fstat(ov->base_fd, &st) < 0 || (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode))) {
		r = fail(err, errlen, -EINVAL, "%s: not a regular file or block device", base);
		goto fail;
	}
	off_t end = lseek(ov->base_fd, 0, SEEK_END);
	if (end <= 0 || (uint64_t)end > OVERLAY_DISK_MAX) {
		r = fail(err, errlen, -EINVAL, "%s: base size %lld is empty or over the 1 PiB cap",
			 base, (long long)end);
		goto fail;
	}
	ov->disk_size = (uint64_t)end;
	size_t plen = strlen(path);
	ov->map_path = malloc(plen + sizeof(OVERLAY_MAP_SUFFIX));
	if (!ov->map_path) {
		r = -ENOMEM;
		goto fail;
	}
	memcpy(ov->map_path, path, plen);
	memcpy(ov->map_path + plen, OVERLAY_MAP_SUFFIX, sizeof(OVERLAY_MAP_SUFFIX));

	map_fd = open(ov->map_path, O_RDONLY | O_CLOEXEC);
	if (map_fd >= 0) {
		size_t mlen = 0;
		r = read_map_file(map_fd, &mbuf, &mlen);
		if (r) {
			fail(err, errlen, r, "overlay map %s: %s", ov->map_path, strerror(-r));
			goto fail;
		}
		struct overlay_map_info info;
		char why[160];
		r = overlay_map_parse(mbuf, mlen, &info, why, sizeof(why));
		if (r) {
			fail(err, errlen, r, "overlay map %s: %s", ov->map_path, why);
			goto fail;
		}
		if (info.disk_size != ov->disk_size) {
			r = fail(err, errlen, -EINVAL,
				 "overlay map %s was made for a %llu-byte disk but base %s is %llu "
				 "bytes",
				 ov->map_path, (unsigned long long)info.disk_size, base,
				 (unsigned long long)ov->disk_size);
			goto fail;
		}
		ov->chunk_size = info.chunk_size;
		ov->nr_chunks = info.nr_chunks;
		ov->bitmap_bytes = info.bitmap_bytes;
		ov->bitmap = malloc(info.bitmap_bytes);
		if (!ov->bitmap) {
			r = -ENOMEM;
			goto fail;
		}
		memcpy(ov->bitmap, info.bitmap, info.bitmap_bytes);
		ov->data_fd = open(path, O_RDWR | O_CLOEXEC);
		if (ov->data_fd < 0) {
			r = fail(err, errlen, -errno, "overlay data %s: %s (its map exists)", path,
				 strerror(errno));
			goto fail;
		}
		if (fstat(ov->data_fd, &st) < 0 || !S_ISREG(st.st_mode) ||
		    (uint64_t)st.st_size < ov->disk_size) {
			r = fail(err, errlen, -EINVAL,
				 "overlay data %s: not a regular file of at least %llu bytes", path,
				 (unsigned long long)ov->disk_size);
			goto fail;
		}
	} else if (errno == ENOENT) {
		/*
		 * A new overlay. A data file left without a map (a crash before the first map
		 * write) holds no chunk anyone refers to, so it is reused as it is.
		 */
		ov->chunk_size = chunk_size;
		ov->nr_chunks = (ov->disk_size + chunk_size - 1) / chunk_size;
		ov->bitmap_bytes = (size_t)((ov->nr_chunks + 7) / 8);
		if (ov->bitmap_bytes > OVERLAY_BITMAP_MAX) {
			r = fail(err, errlen, -EINVAL, "overlay: disk too large for chunk size %u",
				 chunk_size);
			goto fail;
		}
		ov->bitmap = calloc(1, ov->bitmap_bytes);
		if (!ov->bitmap) {
			r = -ENOMEM;
			goto fail;
		}
		ov->data_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (ov->data_fd < 0) {
			r = fail(err, errlen, -errno, "overlay data %s: %s", path, strerror(errno));
			goto fail;
		}
		if (fstat(ov->data_fd, &st) < 0 || !S_ISREG(st.st_mode)) {
			r = fail(err, errlen, -EINVAL, "overlay data %s: not a regular file", path);
			goto fail;
		}
		if ((uint64_t)st.st_size != ov->disk_size &&
		    ftruncate(ov->data_fd, (off_t)end) < 0) {
			r = fail(err, errlen, -errno, "overlay data %s: %s", path, strerror(errno));
			goto fail;
		}
		r = write_map(ov);
		if (r) {
			fail(err, errlen, r, "overlay map %s: %s", ov->map_path, strerror(-r));
			goto fail;
		}
	} else {
		r = fail(err, errlen, -errno, "overlay map %s: %s", ov->map_path, strerror(errno));
		goto fail;
	}
	ov->chunk_buf = malloc(ov->chunk_size);
	if (!ov->chunk_buf) {
		r = -ENOMEM;
		goto fail;
	}
	if (map_fd >= 0)
		close(map_fd);
	free(mbuf);
	return 0;
fail:
	if (r == -ENOMEM)
		fail(err, errlen, r, "overlay: out of memory");
	if (map_fd >= 0)
		close(map_fd);
	free(mbuf);
	ov->map_dirty = false;
	overlay_close(ov);
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
	ov->data_fd = ov->base_fd = -1;
	free(ov->bitmap);
	free(ov->map_path);
	free(ov->chunk_buf);
	ov->bitmap = NULL;
	ov->map_path = NULL;
	ov->chunk_buf = NULL;
	return r;
}
