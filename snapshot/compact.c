/* Chain compaction: merges a base and its increments into one new full layer, so chains stay short.
 */
#include "snapshot/compact.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/crc32.h"
#include "common/file_io.h"
#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "snapshot/digest.h"
#include "snapshot/layer_restore.h"
#include "snapshot/mem_layer.h"
#include "snapshot/state_file.h"

#define RUN_MAX (256u)

static int copy_base(int in, int out, const struct mem_layer_info *li)
{
	return file_copy_runs(in, out, (off_t)li->data_off, (off_t)mem_layer_file_size(li));
}

/* Applies one increment: its pages overwrite, its zero pages become holes. */
static int apply_diff(const struct mem_layer *l, int out, uint8_t *buf)
{
	const struct mem_layer_info *li = &l->info;
	uint64_t p = 0;
	while (p < li->nr_pages) {
		if (!mem_layer_has(l, p)) {
			p++;
			continue;
		}
		uint64_t n = 1;
		while (n < RUN_MAX && p + n < li->nr_pages && mem_layer_has(l, p + n))
			n++;
		off_t off = (off_t)(li->data_off + p * MEM_LAYER_PAGE);
		int r = pread_full(l->fd, buf, n * MEM_LAYER_PAGE, off);
		if (r)
			return r;
		for (uint64_t i = 0; i < n; i++) {
			const uint8_t *pg = buf + i * MEM_LAYER_PAGE;
			off_t o = off + (off_t)(i * MEM_LAYER_PAGE);
			if (mem_page_is_zero(pg)) {
				if (fallocate(out, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, o,
					      MEM_LAYER_PAGE) < 0 &&
				    pwrite(out, pg, MEM_LAYER_PAGE, o) != (ssize_t)MEM_LAYER_PAGE)
					return -EIO;
			} else if (pwrite(out, pg, MEM_LAYER_PAGE, o) != (ssize_t)MEM_LAYER_PAGE) {
				return -errno ? -errno : -EIO;
			}
		}
		p += n;
	}
	return 0;
}

static uint64_t count_data_pages(int fd, const struct mem_layer_info *li)
{
	uint64_t pages = 0;
	off_t end = (off_t)mem_layer_file_size(li), off = (off_t)li->data_off;
	while (off < end) {
		off_t d = lseek(fd, off, SEEK_DATA);
		if (d < 0)
			break;
		off_t h = lseek(fd, d, SEEK_HOLE);
		if (h < 0)
			h = end;
		pages += (uint64_t)(h - d) / MEM_LAYER_PAGE;
		off = h;
	}
	return pages;
}

int chain_compact(struct chain *c, char *err, size_t errlen)
{
	if (c->nr_layers < 2)
		return 0;
	struct layer_set ls;
	int r = layer_set_open(&ls, c, c->nr_layers - 1, err, errlen);
	if (r)
		return r;
	const struct chain_layer *last = chain_latest(c);
	char name[CHAIN_NAME_MAX], tmp[CHAIN_NAME_MAX + 32];
	snprintf(name, sizeof(name), "mem-%06llu-c", (unsigned long long)last->id);
	tmp[0] = 0;
	uint8_t *buf = malloc(RUN_MAX * MEM_LAYER_PAGE);
	uint8_t *meta = NULL;
	struct chain *nc = malloc(sizeof(*nc));
	int out = -1;
	bool placed = false;
	int dfd = dirfd_open_dir(c->dir, false, err, errlen);
	if (dfd < 0) {
		r = dfd;
		goto out;
	}
	/* A fresh name: nothing is replaced or unlinked first (the jailed VMM may not). */
	out = dirfd_create_tmp(dfd, name, tmp, sizeof(tmp), O_RDWR, 0600);
	if (!buf || !nc || out < 0) {
		r = out < 0 ? errmsg(err, errlen, out, "cannot create a temporary file in %s: %s",
				     c->dir, strerror(-out))
			    : -ENOMEM;
		goto out;
	}
	struct mem_layer_info li = ls.layers[0].info;
	li.layer_id = last->id;
	li.parent_id = 0;
	li.flags = MEM_LAYER_FULL;
	if (ftruncate(out, (off_t)mem_layer_file_size(&li)) < 0) {
		r = -errno;
		goto fail;
	}
	r = copy_base(ls.layers[0].fd, out, &ls.layers[0].info);
	for (int i = 1; !r && i < ls.nr; i++)
		r = apply_diff(&ls.layers[i], out, buf);
	if (r)
		goto fail;
	/* The merged layer holds every page (absent ones are zero, as in any full layer). */
	meta = calloc(1, li.data_off);
	if (!meta) {
		r = -ENOMEM;
		goto fail;
	}
	uint64_t *bm = (uint64_t *)(meta + li.bitmap_off);
	memset(bm, 0xff, li.bitmap_len);
	if (li.nr_pages % 64)
		bm[li.bitmap_len / 8 - 1] = (1ULL << (li.nr_pages % 64)) - 1;
	li.bitmap_crc = crc32_update(0, bm, li.bitmap_len);
	li.present = li.nr_pages;
	li.stored = count_data_pages(out, &li);
	mem_layer_header_build(&li, meta);
	if (pwrite(out, meta, li.data_off, 0) != (ssize_t)li.data_off || fdatasync(out) < 0) {
		r = -EIO;
		goto fail;
	}
	uint8_t sha[DIGEST_LEN];
	r = digest_fd(out, sha);
	if (r)
		goto fail;
	/* mem-N-c, or (one left by a compaction that died before its commit) mem-N-c2, ... */
	for (int k = 1; k <= 16; k++) {
		if (k > 1)
			snprintf(name, sizeof(name), "mem-%06llu-c%d", (unsigned long long)last->id,
				 k);
		r = dirfd_rename_noreplace(dfd, tmp, name);
		if (r != -EEXIST)
			break;
	}
	if (r)
		goto fail;
	placed = true;
	*nc = *c;
	nc->nr_layers = 1;
	nc->layers[0] = *last;
	nc->layers[0].parent = 0;
	nc->layers[0].full = true;
	snprintf(nc->layers[0].mem, CHAIN_NAME_MAX, "%s", name);
	nc->layers[0].present = li.present;
	nc->layers[0].stored = li.stored;
	/* The state file and disk layers keep their digests; the merged layer gets its own. */
	chain_digest_prune(nc);
	r = chain_digest_set(nc, name, sha); /* chain_commit reads a state file without one */
	if (!r)
		r = chain_commit(nc, err, errlen);
	if (r)
		goto fail;
	*c = *nc;
	goto out;
fail:
	errmsg(err, errlen, r, "compacting %s: %s", c->dir, strerror(-r));
	/* Best effort (EPERM in the jail): chain_settle removes what no generation lists. */
	(void)dirfd_unlink(dfd, placed ? name : tmp);
out:
	if (out >= 0)
		close(out);
	if (dfd >= 0)
		close(dfd);
	free(meta);
	free(buf);
	free(nc);
	layer_set_close(&ls);
	return r;
}
