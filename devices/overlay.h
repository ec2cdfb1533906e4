/* Copy-on-write disk overlay: a read-only base image plus a sparse data file and an allocation map.
 */
#ifndef COVE_OVERLAY_H
#define COVE_OVERLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/* On-disk format: devices/OVERLAY.md. All integers little-endian. */
#define OVERLAY_MAP_MAGIC    "COVEOVLM"
#define OVERLAY_MAP_VERSION  2	/* written; version 1 (a single layer on the base) is still read */
#define OVERLAY_MAP_HDR_SIZE 52 /* version 2 */
#define OVERLAY_MAP_HDR_V1   40
#define OVERLAY_MAP_FROZEN   1u /* flags: a read-only layer with a newer layer on top */
/* flags: a frozen layer of an encrypted chain: chunks sealed, map authenticated (version 3) */
#define OVERLAY_MAP_SEALED	   2u
#define OVERLAY_MAP_VERSION_SEALED 3
#define OVERLAY_MAP_HDR_SEALED	   152 /* version 3 */
#define OVERLAY_MAP_MAC_OFF	   88 /* version 3: the map's sealed digest, OVERLAY_MAC_LEN bytes */
#define OVERLAY_CHAIN_ID_LEN	   16
#define OVERLAY_MAC_LEN		   60
#define OVERLAY_SALT_LEN	   16
#define OVERLAY_TAG_LEN		   16
#define OVERLAY_CHAIN_MAX	   16 /* layers in a chain, the writable top included */
#define OVERLAY_CHUNK_DEFAULT	   (64u << 10)
#define OVERLAY_CHUNK_MIN	   (4u << 10)
#define OVERLAY_CHUNK_MAX	   (16u << 20)
#define OVERLAY_DISK_MAX	   (1ULL << 50) /* 1 PiB */
#define OVERLAY_BITMAP_MAX	   (64u << 20)	/* bytes: 512 Mi chunks */
#define OVERLAY_MAP_SUFFIX	   ".map"

struct overlay_map_info {
	uint32_t version;
	uint32_t flags;	     /* OVERLAY_MAP_FROZEN, OVERLAY_MAP_SEALED */
	uint32_t depth;	     /* layers below this one (0: directly on the base) */
	uint32_t parent_crc; /* CRC-32 of the whole map file of the layer below (0 at depth 0) */
	uint32_t chunk_size;
	uint64_t disk_size;
	uint64_t nr_chunks;
	const uint8_t *bitmap; /* points into the parsed buffer */
	size_t bitmap_bytes;
	/* Sealed (version 3) only. */
	uint64_t layer_id;
	const uint8_t *salt;	 /* OVERLAY_SALT_LEN bytes in the buffer */
	const uint8_t *chain_id; /* the chain that sealed it, OVERLAY_CHAIN_ID_LEN bytes */
	const uint8_t *mac;	 /* OVERLAY_MAC_LEN bytes in the buffer */
};

/*
 * Sealing of frozen layers in an encrypted snapshot chain (devices/OVERLAY.md, snapshot/
 * CRYPTO.md), given by the snapshot code so this layer needs no key: each chunk is sealed
 * under (chain id, layer id, salt, chunk index) with a 16-byte tag; a map is authenticated by a
 * sealed digest of its bytes [0, OVERLAY_MAP_MAC_OFF) and its bitmap. `chain_id` is the chain
 * this sealer seals into; a layer sealed by another chain of the same data key (the chain a
 * sandbox was restored from) is opened with the chain id its map records. The functions may
 * be called from any thread (the implementation locks). 0, -EBADMSG (not authentic), -errno.
 */
struct overlay_sealer {
	void *opaque;
	uint8_t chain_id[OVERLAY_CHAIN_ID_LEN];
	int (*seal)(void *opaque, const uint8_t chain_id[OVERLAY_CHAIN_ID_LEN], uint64_t layer_id,
		    const uint8_t salt[OVERLAY_SALT_LEN], uint64_t chunk, const void *in,
		    size_t len, void *out, uint8_t tag[OVERLAY_TAG_LEN]);
	int (*open)(void *opaque, const uint8_t chain_id[OVERLAY_CHAIN_ID_LEN], uint64_t layer_id,
		    const uint8_t salt[OVERLAY_SALT_LEN], uint64_t chunk, const void *in,
		    size_t len, void *out, const uint8_t tag[OVERLAY_TAG_LEN]);
	int (*seal_map)(void *opaque, const uint8_t chain_id[OVERLAY_CHAIN_ID_LEN],
			const uint8_t *hdr, size_t hdr_len, const uint8_t *bitmap,
			size_t bitmap_len, uint8_t mac[OVERLAY_MAC_LEN]);
	int (*check_map)(void *opaque, const uint8_t chain_id[OVERLAY_CHAIN_ID_LEN],
			 const uint8_t *hdr, size_t hdr_len, const uint8_t *bitmap,
			 size_t bitmap_len, const uint8_t mac[OVERLAY_MAC_LEN]);
};

/* A frozen (read-only) layer below the writable top. */
struct overlay_layer {
	int data_fd;
	uint8_t *bitmap;
	uint32_t map_crc; /* CRC-32 of its whole map file: the next layer's parent_crc */
	/*
	 * Sealed layers: chunks are ciphertext (tags after the disk's bytes in the data file).
	 * Until a sealer has authenticated the map (overlay_attach_sealer), nothing is read.
	 */
	bool sealed;
	uint64_t layer_id;
	uint8_t salt[OVERLAY_SALT_LEN];
	uint8_t chain_id[OVERLAY_CHAIN_ID_LEN];
	uint8_t hdr[OVERLAY_MAP_MAC_OFF];
	uint8_t mac[OVERLAY_MAC_LEN];
	const struct overlay_sealer *sealer; /* NULL: not authenticated yet */
	char *map_path;
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
	/*
	 * The top's map, open for writing since it was opened or made (set-up, or a freeze that
	 * made it): rewritten in place, because under the VMM's seccomp filter no file that
	 * exists can be opened for writing or replaced by a rename (sandbox/SECCOMP.md). -1: none.
	 */
	int map_fd;
	uint8_t *chunk_buf; /* one chunk, for copy-up */
	uint64_t copy_ups;
	uint8_t *zero_buf; /* one chunk of zeros, allocated on the first write_zeroes */
	/* The top's place in the chain, recorded in its map. */
	uint32_t depth;
	uint32_t parent_crc;
	bool frozen;
	/* Frozen layers below the top, oldest (directly on the base) first. */
	int nr_layers;
	struct overlay_layer layers[OVERLAY_CHAIN_MAX - 1];
	/*
	 * Set by the owner before overlay_freeze when the snapshot chain is encrypted: the top is
	 * sealed as it freezes, under this sealer and layer id. NULL: frozen in clear.
	 */
	const struct overlay_sealer *sealer;
	uint64_t seal_layer_id;
	uint8_t *open_buf; /* one chunk, for reading sealed chunks */
};

/*
 * Checks a whole map file held in `buf` (untrusted): magic, version, chunk size, size caps,
 * exact length, CRCs, no bits past the last chunk. 0, or -EINVAL with a message in `err`.
 */
/* Frozen layer k's data file path (its map path without ".map"), or -ENAMETOOLONG/-ERANGE. */
int overlay_layer_path(const struct overlay *ov, int k, char *out, size_t cap);

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
/*
 * Opens a chain: `paths[0..n-2]` are frozen layers, oldest first (paths[0] sits on `base`), and
 * `paths[n-1]` is the writable top, created (depth n-1, parent = the layer below) when its map is
 * absent. Every layer's map must name its place: depth, frozen flag, and the CRC-32 of the map
 * file of the layer below. n is 1..OVERLAY_CHAIN_MAX; overlay_open() is n == 1.
 */
int overlay_open_chain(struct overlay *ov, const char *base, const char *const *paths, int n,
		       uint32_t chunk_size, char *err, size_t errlen);
/*
 * Flushes the top (data synced, map written with the frozen flag), keeps it as a read-only
 * layer, and starts a new empty top at `path` (`path`.map must not exist) whose reads fall
 * through to the frozen layers and the base. With ov->sealer set the frozen layer is sealed
 * first: its chunks are encrypted into a new data file that replaces the plain one, and its
 * map (version 3) carries the layer id, a fresh random salt and a sealed digest. On failure
 * the old top stays the writable top. 0, or -errno with a message in `err`.
 */
int overlay_freeze(struct overlay *ov, const char *path, char *err, size_t errlen);
/*
 * Authenticates every sealed frozen layer not yet authenticated with `s` (its map's sealed
 * digest) and lets its chunks be read through `s`. 0, or -EBADMSG with a one-line message
 * naming the map. Reads from a sealed layer no sealer has authenticated fail with -EACCES.
 */
int overlay_attach_sealer(struct overlay *ov, const struct overlay_sealer *s, char *err,
			  size_t errlen);
/* Frozen layers that are sealed and that are in clear. */
void overlay_count_sealed(const struct overlay *ov, int *sealed, int *plain);
/*
 * Opens every chunk of every sealed layer (restore --verify). 0, or -EBADMSG / -EACCES /
 * -errno with a message naming the layer and chunk.
 */
int overlay_verify_sealed(struct overlay *ov, char *err, size_t errlen);
/* True when the top layer holds the chunk (frozen layers are not consulted). */
bool overlay_chunk_allocated(const struct overlay *ov, uint64_t chunk);
/* Reads/writes `len` bytes at disk offset `off` from/into the iovecs. 0 or -errno. */
int overlay_read(struct overlay *ov, uint64_t off, const struct iovec *iov, int niov, uint64_t len);
int overlay_write(struct overlay *ov, uint64_t off, const struct iovec *iov, int niov,
		  uint64_t len);
/*
 * Makes [off, off+len) read as zeros (copy-up semantics for partial chunks). With `unmap`, whole
 * chunks are hole-punched in the data file where the filesystem allows it. 0 or -errno.
 */
int overlay_write_zeroes(struct overlay *ov, uint64_t off, uint64_t len, bool unmap);
/* Makes written data durable, then the map (data first: the map never names unwritten chunks). */
int overlay_flush(struct overlay *ov);
/* Flushes (errors are returned but the files are closed anyway) and frees everything. */
int overlay_close(struct overlay *ov);

#endif
