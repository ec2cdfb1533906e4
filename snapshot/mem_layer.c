/* Memory layer files: a checksummed header, a bitmap of the pages the layer holds, then the pages at their own offsets (sparse). */
#include "snapshot/mem_layer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/byteorder.h"
#include "common/crc32.h"
#include "common/errmsg.h"
#include "common/file_io.h"
#include "snapshot/state_file.h"

/* 1 TiB of RAM, as guest_mem allows. */
#define MAX_RAM (1ULL << 40)

void mem_layer_layout(struct mem_layer_info *li, uint64_t ram_size)
{
	li->ram_size = ram_size;
	li->nr_pages = ram_size / MEM_LAYER_PAGE;
	li->bitmap_off = MEM_LAYER_HDR;
	li->bitmap_len = (li->nr_pages + 63) / 64 * 8;
	uint64_t end = li->bitmap_off + li->bitmap_len;
	li->stored_off = li->tag_off = 0;
	if (li->flags & MEM_LAYER_ENCRYPTED) {
		li->stored_off = end;
		end += li->bitmap_len;
	}
	li->data_off = (end + MEM_LAYER_PAGE - 1) & ~(MEM_LAYER_PAGE - 1);
	if (li->flags & MEM_LAYER_ENCRYPTED)
		li->tag_off = li->data_off + li->nr_pages * MEM_LAYER_PAGE;
}

uint64_t mem_layer_file_size(const struct mem_layer_info *li)
{
	uint64_t size = li->data_off + li->nr_pages * MEM_LAYER_PAGE;
	if (li->flags & MEM_LAYER_ENCRYPTED)
		size += li->nr_pages * 16;
	return size;
}

void mem_layer_header_build(const struct mem_layer_info *li, uint8_t hdr[MEM_LAYER_HDR])
{
	memset(hdr, 0, MEM_LAYER_HDR);
	memcpy(hdr, MEM_LAYER_MAGIC, 8);
	put_le32(hdr + 8, MEM_LAYER_VERSION);
	put_le32(hdr + 12, (uint32_t)MEM_LAYER_PAGE);
	put_le64(hdr + 16, li->layer_id);
	put_le64(hdr + 24, li->parent_id);
	put_le64(hdr + 32, li->ram_size);
	put_le64(hdr + 40, li->nr_pages);
	put_le64(hdr + 48, li->bitmap_off);
	put_le64(hdr + 56, li->bitmap_len);
	put_le64(hdr + 64, li->data_off);
	put_le64(hdr + 72, li->present);
	put_le64(hdr + 80, li->stored);
	memcpy(hdr + 88, li->chain_id, 16);
	put_le32(hdr + 104, li->flags);
	put_le32(hdr + 108, li->bitmap_crc);
	memcpy(hdr + MEM_LAYER_SALT_OFF, li->salt, sizeof(li->salt));
	memcpy(hdr + MEM_LAYER_META_OFF, li->meta, MEM_LAYER_META_LEN);
	put_le32(hdr + MEM_LAYER_HDR - 4, crc32_update(0, hdr, MEM_LAYER_HDR - 4));
}

int mem_layer_header_parse(const uint8_t *hdr, size_t len, struct mem_layer_info *li, char *err,
			   size_t errlen)
{
	if (len < MEM_LAYER_HDR)
		return errmsg(err, errlen, -EINVAL, "memory layer is truncated (no header)");
	if (memcmp(hdr, MEM_LAYER_MAGIC, 8))
		return errmsg(err, errlen, -EINVAL, "not a cove memory layer (bad magic)");
	if (get_le32(hdr + MEM_LAYER_HDR - 4) != crc32_update(0, hdr, MEM_LAYER_HDR - 4))
		return errmsg(err, errlen, -EINVAL, "memory layer header is corrupt (CRC mismatch)");
	uint32_t v = get_le32(hdr + 8);
	if (v != MEM_LAYER_VERSION)
		return errmsg(err, errlen, -EINVAL,
			      "memory layer version %u is not supported (this cove reads %u)", v,
			      MEM_LAYER_VERSION);
	if (get_le32(hdr + 12) != MEM_LAYER_PAGE)
		return errmsg(err, errlen, -EINVAL, "memory layer page size is not 4096");
	memset(li, 0, sizeof(*li));
	uint64_t ram = get_le64(hdr + 32);
	if (ram == 0 || ram > MAX_RAM || ram % MEM_LAYER_PAGE)
		return errmsg(err, errlen, -EINVAL, "memory layer RAM size %llu is invalid",
			      (unsigned long long)ram);
	li->flags = get_le32(hdr + 104);
	if (li->flags & ~(MEM_LAYER_FULL | MEM_LAYER_ENCRYPTED))
		return errmsg(err, errlen, -EINVAL, "memory layer has unknown flags 0x%x", li->flags);
	mem_layer_layout(li, ram);
	if (get_le64(hdr + 40) != li->nr_pages || get_le64(hdr + 48) != li->bitmap_off ||
	    get_le64(hdr + 56) != li->bitmap_len || get_le64(hdr + 64) != li->data_off)
		return errmsg(err, errlen, -EINVAL, "memory layer offsets do not match its RAM size");
	li->layer_id = get_le64(hdr + 16);
	li->parent_id = get_le64(hdr + 24);
	li->present = get_le64(hdr + 72);
	li->stored = get_le64(hdr + 80);
	memcpy(li->chain_id, hdr + 88, 16);
	li->bitmap_crc = get_le32(hdr + 108);
	memcpy(li->salt, hdr + MEM_LAYER_SALT_OFF, sizeof(li->salt));
	memcpy(li->meta, hdr + MEM_LAYER_META_OFF, MEM_LAYER_META_LEN);
	if (li->present > li->nr_pages || li->stored > li->present)
		return errmsg(err, errlen, -EINVAL, "memory layer page counts are invalid");
	return 0;
}

int mem_layer_open(struct mem_layer *l, const char *path, char *err, size_t errlen)
{
	memset(l, 0, sizeof(*l));
	l->fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC); /* a chain names its own files */
	if (l->fd < 0)
		return errmsg(err, errlen, -errno, "cannot open memory layer %s: %s", path,
			      strerror(errno));
	uint8_t *hdr = malloc(MEM_LAYER_HDR);
	int r = -ENOMEM;
	if (!hdr)
		goto fail;
	ssize_t k = pread(l->fd, hdr, MEM_LAYER_HDR, 0);
	r = mem_layer_header_parse(hdr, k < 0 ? 0 : (size_t)k, &l->info, err, errlen);
	free(hdr);
	if (r)
		goto fail_named;
	struct stat st;
	if (fstat(l->fd, &st) < 0) {
		r = -errno;
		goto fail;
	}
	if ((uint64_t)st.st_size != mem_layer_file_size(&l->info)) {
		r = errmsg(err, errlen, -EINVAL,
			   "memory layer %s is truncated or too long (%lld bytes, expected %llu)",
			   path, (long long)st.st_size,
			   (unsigned long long)mem_layer_file_size(&l->info));
		goto fail;
	}
	bool enc = l->info.flags & MEM_LAYER_ENCRYPTED;
	size_t bmlen = (size_t)l->info.bitmap_len * (enc ? 2 : 1);
	l->bitmap = malloc(bmlen);
	if (!l->bitmap) {
		r = -ENOMEM;
		goto fail;
	}
	if (pread_full(l->fd, l->bitmap, bmlen, (off_t)l->info.bitmap_off)) {
		r = errmsg(err, errlen, -EIO, "cannot read the bitmap of %s", path);
		goto fail;
	}
	if (enc)
		l->stored = l->bitmap + l->info.bitmap_len / 8;
	if (crc32_update(0, l->bitmap, bmlen) != l->info.bitmap_crc) {
		r = errmsg(err, errlen, -EINVAL, "memory layer %s: page bitmap is corrupt", path);
		goto fail;
	}
	/* No bit may name a page past the end of RAM. */
	if (l->info.nr_pages % 64 &&
	    l->bitmap[l->info.nr_pages / 64] >> (l->info.nr_pages % 64)) {
		r = errmsg(err, errlen, -EINVAL, "memory layer %s: bitmap names pages past RAM", path);
		goto fail;
	}
	/* Encrypted: a page with data must be a page the layer holds. */
	for (uint64_t i = 0; l->stored && i < l->info.bitmap_len / 8; i++) {
		if (l->stored[i] & ~l->bitmap[i]) {
			r = errmsg(err, errlen, -EINVAL, "memory layer %s: data bitmap is inconsistent",
				   path);
			goto fail;
		}
	}
	uint64_t cnt = 0;
	for (uint64_t i = 0; i < l->info.bitmap_len / 8; i++)
		cnt += (uint64_t)__builtin_popcountll(l->bitmap[i]);
	if (cnt != l->info.present) {
		r = errmsg(err, errlen, -EINVAL, "memory layer %s: bitmap holds %llu pages, header %llu",
			   path, (unsigned long long)cnt, (unsigned long long)l->info.present);
		goto fail;
	}
	return 0;
fail_named:
	{
		/* Prefix the parse error with the file name. */
		char tmp[256];
		snprintf(tmp, sizeof(tmp), "%s", err ? err : "");
		errmsg(err, errlen, r, "%s: %s", path, tmp);
	}
fail:
	mem_layer_close(l);
	return r;
}

void mem_layer_close(struct mem_layer *l)
{
	if (l->fd >= 0)
		close(l->fd);
	free(l->bitmap);
	l->fd = -1;
	l->bitmap = NULL;
	l->stored = NULL;
}
