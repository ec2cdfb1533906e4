/* Memory layer files: a checksummed header, a bitmap of the pages the layer holds, then the pages at their own offsets (sparse). */
#ifndef COVE_MEM_LAYER_H
#define COVE_MEM_LAYER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MEM_LAYER_MAGIC "COVEMEM\0"
#define MEM_LAYER_VERSION 1
#define MEM_LAYER_HDR 4096ULL
#define MEM_LAYER_PAGE 4096ULL
#define MEM_LAYER_FULL 1u /* flags: holds every page of RAM (absent = zero) */
/*
 * flags: pages are AES-256-GCM ciphertext (snapshot/CRYPTO.md).  Such a layer also has a
 * second bitmap (pages with data; held pages without are zero), a tag region after the data
 * (16 bytes per page, page p at tag offset + p * 16), and in the header at MEM_LAYER_META_OFF a
 * sealed SHA-256 of the header and both bitmaps, so neither can be altered unnoticed.
 */
#define MEM_LAYER_ENCRYPTED 2u
/*
 * Encrypted layers: the layer's random 16-byte salt (its pages' subkey, snapshot/CRYPTO.md),
 * inside the bytes the sealed digest covers. Zero in plain layers.
 */
#define MEM_LAYER_SALT_OFF 112
#define MEM_LAYER_META_OFF 128
#define MEM_LAYER_META_LEN 60 /* crypto_seal_blob of 32 bytes */

/*
 * Layout (little-endian):
 *   [0, 4096)      header: magic[8], version u32, page size u32, layer id u64, parent id u64,
 *                  RAM bytes u64, pages u64, bitmap offset u64, bitmap bytes u64, data offset
 *                  u64, pages present u64, pages stored u64, chain id[16], flags u32, bitmap
 *                  CRC-32 u32, salt[16] (encrypted), sealed digest (encrypted), ...,
 *                  header CRC-32 u32 at 4092 (over bytes 0..4091)
 *   bitmap         bit p set = the layer holds RAM page p
 *   data           page p at data offset + p * 4096; a held page that is all zeros is a hole
 * The file is exactly data offset + pages * 4096 bytes long, so it can be mapped as RAM.
 */
struct mem_layer_info {
	uint64_t layer_id, parent_id;
	uint64_t ram_size, nr_pages;
	uint64_t bitmap_off, bitmap_len, data_off;
	uint64_t present, stored;
	uint8_t chain_id[16];
	uint32_t flags;
	uint32_t bitmap_crc;
	/* Encrypted layers only. */
	uint64_t stored_off; /* the second bitmap, bitmap_len bytes */
	uint64_t tag_off;
	uint8_t salt[16];
	uint8_t meta[MEM_LAYER_META_LEN];
};

/* Fills in offsets for `ram_size` bytes of RAM (and li->flags: encrypted layers differ). */
void mem_layer_layout(struct mem_layer_info *li, uint64_t ram_size);
/* Encodes the 4096-byte header. */
void mem_layer_header_build(const struct mem_layer_info *li, uint8_t hdr[MEM_LAYER_HDR]);
/* Pure: checks and decodes a header (magic, version, CRC, offsets, caps). -EINVAL + `err`. */
int mem_layer_header_parse(const uint8_t *hdr, size_t len, struct mem_layer_info *li, char *err,
			   size_t errlen);
uint64_t mem_layer_file_size(const struct mem_layer_info *li);

/* An open layer: its fd, header and bitmap (malloc'd), checked against the file. */
struct mem_layer {
	int fd;
	struct mem_layer_info info;
	uint64_t *bitmap;
	uint64_t *stored; /* encrypted layers: pages with data */
};

int mem_layer_open(struct mem_layer *l, const char *path, char *err, size_t errlen);
void mem_layer_close(struct mem_layer *l);
static inline bool mem_layer_has(const struct mem_layer *l, uint64_t page)
{
	return page < l->info.nr_pages && (l->bitmap[page / 64] >> (page % 64)) & 1;
}
/* A page that is all zeros is written as a hole (and read back as zeros). */
static inline bool mem_page_is_zero(const uint8_t *p)
{
	const uint64_t *w = (const uint64_t *)p;
	for (size_t i = 0; i < MEM_LAYER_PAGE / 8; i += 8)
		if (w[i] | w[i + 1] | w[i + 2] | w[i + 3] | w[i + 4] | w[i + 5] | w[i + 6] | w[i + 7])
			return false;
	return true;
}
/* The layer has data for the page: encrypted layers say so in their second bitmap; in a plain
 * layer every page it holds is read from it (a held page that is all zeros reads as a hole). */
static inline bool mem_layer_stored(const struct mem_layer *l, uint64_t page)
{
	if (!l->stored)
		return mem_layer_has(l, page);
	return page < l->info.nr_pages && (l->stored[page / 64] >> (page % 64)) & 1;
}

#endif
