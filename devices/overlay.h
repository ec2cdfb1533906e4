/* Copy-on-write disk overlay: a read-only base image plus a sparse data file and an allocation map.
 */
#ifndef COVE_OVERLAY_H
#define COVE_OVERLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/* On-disk format: devices/OVERLAY.md. All integers little-endian. */
#define OVERLAY_MAP_MAGIC     "COVEOVLM"
#define OVERLAY_MAP_VERSION   1
#define OVERLAY_MAP_HDR_SIZE  40
#define OVERLAY_CHUNK_DEFAULT (64u << 10)
#define OVERLAY_CHUNK_MIN     (4u << 10)
#define OVERLAY_CHUNK_MAX     (16u << 20)
#define OVERLAY_DISK_MAX      (1ULL << 50) /* 1 PiB */
#define OVERLAY_BITMAP_MAX    (64u << 20)  /* bytes: 512 Mi chunks */
#define OVERLAY_MAP_SUFFIX    ".map"

struct overlay_map_info {
	uint32_t version;
	uint32_t chunk_size;
	uint64_t disk_size;
	uint64_t nr_chunks;
	const uint8_t *bitmap; /* points into the parsed buffer */
	size_t bitmap_bytes;
};

struct overlay {
	int base_fd;
	int data_fd;
	uint64_t disk_size;
	uint32_t chunk_size;
	uint64_t nr_chunks;
	uint8_t *bitmap;
	size_t bitmap_bytes;
	bool map_dirty; /* chunks allocated since the map was last written */
	char *map_path;
	uint8_t *chunk_buf; /* one chunk, for copy-up */
	uint64_t copy_ups;
};

/* CRC-32 (IEEE 802.3, as zlib's crc32), continuing from `crc` (0 to start). */
uint32_t overlay_crc32(uint32_t crc, const void *buf, size_t len);
/*
 * Checks a whole map file held in `buf` (untrusted): magic, version, chunk size, size caps,
 * exact length, CRCs, no bits past the last chunk. 0, or -EINVAL with a message in `err`.
 */
int overlay_map_parse(const uint8_t *buf, size_t len, struct overlay_map_info *out, char *err,
		      size_t errlen);
/* Serializes the map of `ov` into a malloc'd buffer. 0 or -errno. */
int overlay_map_build(const struct overlay *ov, uint8_t **buf, size_t *len);

/*
 * Opens `base` read-only and the overlay at `path` (data) and `path`.map, creating both when
 * the map is absent (chunk size `chunk_size`, 0 for the default). A map made for another disk
 * size is refused. 0, or -errno with a one-line message in `err`.
 */
int overlay_open(struct overlay *ov, const char *base, const char *path, uint32_t chunk_size,
		 char *err, size_t errlen);
bool overlay_chunk_allocated(const struct overlay *ov, uint64_t chunk);
/* Reads/writes `len` bytes at disk offset `off` from/into the iovecs. 0 or -errno. */
int overlay_read(struct overlay *ov, uint64_t off, const struct iovec *iov, int niov, uint64_t len);
int overlay_write(struct overlay *ov, uint64_t off, const struct iovec *iov, int niov,
		  uint64_t len);
/* Makes written data durable, then the map (data first: the map never names unwritten chunks). */
int overlay_flush(struct overlay *ov);
/* Flushes (errors are returned but the files are closed anyway) and frees everything. */
int overlay_close(struct overlay *ov);

#endif
