/* Merging an overlay chain's frozen layers into one new frozen layer: newest chunk wins, sparse. */
#include "devices/overlay_merge.h"

#include <errno.h>
#include <fcntl.h>
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

static bool has_chunk(const uint8_t *bitmap, uint64_t c)
{
	return (bitmap[c / 8] >> (c % 8)) & 1;
}

static uint64_t chunk_len(const struct overlay *ov, uint64_t c)
{
	uint64_t left = ov->disk_size - c * ov->chunk_size;
	return left < ov->chunk_size ? left : ov->chunk_size;
}

static bool all_zero(const uint8_t *p, size_t n)
{
	return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
}

/* A whole chunk of frozen layer `l` as the guest reads it (a sealed one opened and checked). */
static int read_chunk(const struct overlay *ov, const struct overlay_layer *l, uint64_t c,
		      uint8_t *buf)
{
	uint64_t clen = chunk_len(ov, c);
	int r = pread_full(l->data_fd, buf, clen, (off_t)(c * ov->chunk_size));
	if (r || !l->sealed)
		return r;
	uint8_t tag[OVERLAY_TAG_LEN];
	r = pread_full(l->data_fd, tag, sizeof(tag), (off_t)(ov->disk_size + c * OVERLAY_TAG_LEN));
	if (!r)
		r = l->sealer->open(l->sealer->opaque, l->chain_id, l->layer_id, l->salt, c, buf,
				    clen, buf, tag);
	return r;
}

/*
 * The merged layer's map: version 2 (plain) or 3 (sealed: layer id, salt, chain id, sealed
 * digest), frozen, depth 0, no parent. malloc'd into *bufp.
 */
static int build_map(const struct overlay *ov, const uint8_t *bitmap,
		     const struct overlay_sealer *sealer, uint64_t layer_id,
		     const uint8_t salt[OVERLAY_SALT_LEN], uint8_t **bufp, size_t *lenp)
{
	size_t hdr = sealer ? OVERLAY_MAP_HDR_SEALED : OVERLAY_MAP_HDR_SIZE;
	size_t len = hdr + ov->bitmap_bytes;
	uint8_t *buf = calloc(1, len);
	if (!buf)
		return -ENOMEM;
	memcpy(buf, OVERLAY_MAP_MAGIC, 8);
	put_le32(buf + 8, sealer ? OVERLAY_MAP_VERSION_SEALED : OVERLAY_MAP_VERSION);
	put_le32(buf + 12, ov->chunk_size);
	put_le64(buf + 16, ov->disk_size);
	put_le64(buf + 24, ov->nr_chunks);
	put_le32(buf + 32, crc32_update(0, bitmap, ov->bitmap_bytes));
	put_le32(buf + 36, OVERLAY_MAP_FROZEN | (sealer ? OVERLAY_MAP_SEALED : 0));
	/* depth 0 and parent 0 (bytes 40..47): the merged layer sits on the base. */
	memcpy(buf + hdr, bitmap, ov->bitmap_bytes);
	if (sealer) {
		put_le64(buf + 48, layer_id);
		memcpy(buf + 56, salt, OVERLAY_SALT_LEN);
		memcpy(buf + 72, sealer->chain_id, OVERLAY_CHAIN_ID_LEN);
		int r = sealer->seal_map(sealer->opaque, sealer->chain_id, buf, OVERLAY_MAP_MAC_OFF,
					 buf + hdr, ov->bitmap_bytes, buf + OVERLAY_MAP_MAC_OFF);
		if (r) {
			free(buf);
			return r;
		}
	}
	put_le32(buf + hdr - 4, crc32_update(0, buf, hdr - 4));
	*bufp = buf;
	*lenp = len;
	return 0;
}

/* Every chunk of the union into `fd`: plain, or sealed with its tag after the disk's bytes. */
static int copy_chunks(struct overlay *ov, int fd, const uint8_t *bitmap,
		       const struct overlay_sealer *sealer, uint64_t layer_id,
		       const uint8_t salt[OVERLAY_SALT_LEN], uint8_t *buf, uint64_t *chunks,
		       uint64_t *bad)
{
	for (uint64_t c = 0; c < ov->nr_chunks; c++) {
		if (!has_chunk(bitmap, c))
			continue;
		int src = ov->nr_layers - 1;
		while (!has_chunk(ov->layers[src].bitmap, c))
			src--;
		uint64_t clen = chunk_len(ov, c);
		uint8_t tag[OVERLAY_TAG_LEN];
		int r = read_chunk(ov, &ov->layers[src], c, buf);
		if (!r && sealer)
			r = sealer->seal(sealer->opaque, sealer->chain_id, layer_id, salt, c, buf,
					 clen, buf, tag);
		/* A plain chunk of zeros stays a hole of the new file; its bit hides the base. */
		if (!r && (sealer || !all_zero(buf, clen)))
			r = pwrite_full(fd, buf, clen, (off_t)(c * ov->chunk_size));
		if (!r && sealer)
			r = pwrite_full(fd, tag, sizeof(tag),
					(off_t)(ov->disk_size + c * OVERLAY_TAG_LEN));
		if (r) {
			*bad = c;
			return r;
		}
		(*chunks)++;
	}
	return 0;
}

/* A new file `name` in `dfd` holding `buf`, synced. */
static int write_new(int dfd, const char *name, const uint8_t *buf, size_t len)
{
	int fd = dirfd_create_new(dfd, name, O_WRONLY, 0600);
	if (fd < 0)
		return fd;
	int r = pwrite_full(fd, buf, len, 0);
	if (!r && fsync(fd) < 0)
		r = -errno;
	if (close(fd) < 0 && !r)
		r = -errno;
	return r;
}

int overlay_merge_build(struct overlay *ov, const char *path, const struct overlay_sealer *sealer,
			uint64_t layer_id, struct overlay_merged *m, char *err, size_t errlen)
{
	memset(m, 0, sizeof(*m));
	m->layer.data_fd = -1;
	if (ov->nr_layers < 1)
		return errmsg(err, errlen, -EINVAL, "overlay: no frozen layers to merge");
	for (int i = 0; i < ov->nr_layers; i++) {
		const struct overlay_layer *l = &ov->layers[i];
		if (l->sealed && !sealer)
			return errmsg(
			    err, errlen, -EACCES,
			    "overlay: sealed layer %s can only be merged into a sealed one",
			    l->map_path ? l->map_path : "?");
		if (l->sealed && !l->sealer)
			return errmsg(err, errlen, -EACCES,
				      "overlay: sealed layer %s was not authenticated",
				      l->map_path ? l->map_path : "?");
	}
	if (sealer && (layer_id == 0 || layer_id > 0xfffffffeULL))
		return errmsg(err, errlen, -ERANGE, "overlay: layer id %llu out of range",
			      (unsigned long long)layer_id);
	char name[256], mname[256 + sizeof(OVERLAY_MAP_SUFFIX)];
	int dfd = dirfd_open_parent(path, name, sizeof(name));
	if (dfd < 0)
		return errmsg(err, errlen, dfd, "overlay: merged layer %s: %s", path,
			      strerror(-dfd));
	snprintf(mname, sizeof(mname), "%s%s", name, OVERLAY_MAP_SUFFIX);
	uint8_t salt[OVERLAY_SALT_LEN] = {0}, *mbuf = NULL;
	size_t mlen = 0;
	uint8_t *bitmap = calloc(1, ov->bitmap_bytes);
	uint8_t *buf = malloc(ov->chunk_size);
	char *map_path = malloc(strlen(path) + sizeof(OVERLAY_MAP_SUFFIX));
	int fd = -1, r = 0;
	uint64_t bad = UINT64_MAX;
	if (!bitmap || !buf || !map_path) {
		r = errmsg(err, errlen, -ENOMEM, "overlay: out of memory");
		goto out;
	}
	sprintf(map_path, "%s%s", path, OVERLAY_MAP_SUFFIX);
	for (int i = 0; i < ov->nr_layers; i++)
		for (size_t k = 0; k < ov->bitmap_bytes; k++)
			bitmap[k] |= ov->layers[i].bitmap[k];
	static const uint8_t zero_salt[OVERLAY_SALT_LEN];
	if (sealer && (getrandom(salt, sizeof(salt), 0) != (ssize_t)sizeof(salt) ||
		       !memcmp(salt, zero_salt, sizeof(salt)))) {
		r = errmsg(err, errlen, -EIO, "overlay: no random salt for the merged layer");
		goto out;
	}
	fd = dirfd_create_new(dfd, name, O_RDWR, 0600);
	if (fd < 0) {
		r = errmsg(err, errlen, fd, "overlay: merged layer %s: %s", path, strerror(-fd));
		goto out;
	}
	uint64_t size = ov->disk_size + (sealer ? ov->nr_chunks * OVERLAY_TAG_LEN : 0);
	r = ftruncate(fd, (off_t)size) < 0 ? -errno : 0;
	if (!r)
		r = copy_chunks(ov, fd, bitmap, sealer, layer_id, salt, buf, &m->chunks, &bad);
	if (!r && fsync(fd) < 0)
		r = -errno;
	if (!r)
		r = build_map(ov, bitmap, sealer, layer_id, salt, &mbuf, &mlen);
	if (!r)
		r = write_new(dfd, mname, mbuf, mlen);
	if (!r)
		r = dirfd_sync(dfd);
	if (r) {
		if (bad != UINT64_MAX)
			errmsg(err, errlen, r, "overlay: merging into %s: chunk %llu: %s", path,
			       (unsigned long long)bad,
			       r == -EBADMSG ? "failed authentication" : strerror(-r));
		else
			errmsg(err, errlen, r, "overlay: merging into %s: %s", path, strerror(-r));
		goto out;
	}
	/* Read through a new read-only fd: not even this process keeps a way to write it. */
	close(fd);
	fd = -1;
	int ro = dirfd_open(dfd, name, O_RDONLY);
	if (ro < 0) {
		r = errmsg(err, errlen, ro, "overlay: merged layer %s: %s", path, strerror(-ro));
		goto out;
	}
	struct overlay_layer *l = &m->layer;
	*l = (struct overlay_layer){.data_fd = ro,
				    .bitmap = bitmap,
				    .map_crc = crc32_update(0, mbuf, mlen),
				    .sealed = sealer != NULL,
				    .layer_id = sealer ? layer_id : 0,
				    .sealer = sealer,
				    .map_path = map_path};
	if (sealer) {
		memcpy(l->salt, salt, sizeof(salt));
		memcpy(l->chain_id, sealer->chain_id, OVERLAY_CHAIN_ID_LEN);
		memcpy(l->hdr, mbuf, OVERLAY_MAP_MAC_OFF);
		memcpy(l->mac, mbuf + OVERLAY_MAP_MAC_OFF, OVERLAY_MAC_LEN);
	}
	bitmap = NULL;
	map_path = NULL;
	m->nr_src = ov->nr_layers;
	m->src_top_crc = ov->layers[ov->nr_layers - 1].map_crc;
out:
	if (fd >= 0)
		close(fd);
	close(dfd);
	free(mbuf);
	free(bitmap);
	free(buf);
	free(map_path);
	return r;
}

int overlay_merge_install(struct overlay *ov, struct overlay_merged *m, char *err, size_t errlen)
{
	if (m->layer.data_fd < 0 || m->nr_src < 1 || m->nr_src != ov->nr_layers ||
	    ov->layers[m->nr_src - 1].map_crc != m->src_top_crc)
		return errmsg(err, errlen, -ESTALE,
			      "overlay: the chain changed since its layers were merged");
	for (int i = 0; i < m->nr_src; i++) {
		close(ov->layers[i].data_fd);
		free(ov->layers[i].bitmap);
		free(ov->layers[i].map_path);
	}
	ov->layers[0] = m->layer;
	ov->nr_layers = 1;
	/* The top now sits on the merged layer; its map says so at the next flush or freeze. */
	ov->depth = 1;
	ov->parent_crc = m->layer.map_crc;
	ov->map_dirty = true;
	memset(m, 0, sizeof(*m));
	m->layer.data_fd = -1;
	return 0;
}

void overlay_merged_free(struct overlay_merged *m)
{
	if (m->layer.data_fd >= 0)
		close(m->layer.data_fd);
	free(m->layer.bitmap);
	free(m->layer.map_path);
	memset(m, 0, sizeof(*m));
	m->layer.data_fd = -1;
}
