/* Opening a chain's memory layers for restore: validation, then RAM = base mapped privately +
 * increments copied in. */
#include "snapshot/layer_restore.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/file_io.h"
#include "common/errmsg.h"

int layer_set_open(struct layer_set *ls, const struct chain *c, int upto, char *err, size_t errlen)
{
	ls->nr = 0;
	if (upto < 0 || upto >= c->nr_layers)
		return errmsg(err, errlen, -EINVAL, "the chain has no layer %d", upto);
	for (int i = 0; i <= upto; i++) {
		const struct chain_layer *cl = &c->layers[i];
		char path[4200];
		snprintf(path, sizeof(path), "%s/%s", c->dir, cl->mem);
		struct mem_layer *l = &ls->layers[i];
		int r = mem_layer_open(l, path, err, errlen);
		if (r) {
			layer_set_close(ls);
			return r;
		}
		ls->nr = i + 1;
		const struct mem_layer_info *li = &l->info;
		const char *why = NULL;
		if (li->layer_id != cl->id || li->parent_id != cl->parent)
			why = "its layer id or parent does not match chain.json";
		else if (memcmp(li->chain_id, c->chain_id, 16))
			why = "it belongs to another chain";
		else if (li->ram_size != c->ram_size)
			why = "its RAM size differs from the chain's";
		else if (!!(li->flags & MEM_LAYER_FULL) != cl->full)
			why = "full/increment flag does not match chain.json";
		if (why) {
			layer_set_close(ls);
			return errmsg(err, errlen, -EINVAL, "memory layer %s: %s", path, why);
		}
	}
	return 0;
}

void layer_set_close(struct layer_set *ls)
{
	for (int i = 0; i < ls->nr; i++)
		mem_layer_close(&ls->layers[i]);
	ls->nr = 0;
}

/* Held zero pages at least this long are mapped, not read (bounds the mappings a restore adds). */
#define ZERO_RUN_MAP (2ULL << 20)

/*
 * Pages [p, p+run) held by layer `l` into the private RAM mapping. Long runs of held zero pages
 * (holes in the layer file: pages a balloon gave back, or never written) get fresh anonymous
 * memory, which reads zeros without allocating; reading them would copy zeros into anonymous
 * memory of their own. Everything else is read. 0 or -errno.
 */
static int apply_run(const struct mem_layer *l, uint8_t *ram, uint64_t p, uint64_t run)
{
	uint64_t off = l->info.data_off + p * MEM_LAYER_PAGE, end = off + run * MEM_LAYER_PAGE;
	uint8_t *dst = ram + p * MEM_LAYER_PAGE;
	while (off < end) {
		off_t d = lseek(l->fd, (off_t)off, SEEK_DATA);
		uint64_t data = d < 0 ? (errno == ENXIO ? end : off) : (uint64_t)d;
		data = data > end ? end : data & ~(MEM_LAYER_PAGE - 1);
		if (data < off)
			data = off;
		if (data - off >= ZERO_RUN_MAP &&
		    mmap(dst, data - off, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1,
			 0) != MAP_FAILED) {
			(void)madvise(dst, data - off, MADV_DONTDUMP);
			dst += data - off;
			off = data;
			continue;
		}
		/* Read up to the next hole worth mapping (short holes are read with the data). */
		uint64_t stop = data;
		while (stop < end) {
			off_t h = lseek(l->fd, (off_t)stop, SEEK_HOLE);
			uint64_t hole = h < 0 ? end : (uint64_t)h;
			hole =
			    hole > end ? end : (hole + MEM_LAYER_PAGE - 1) & ~(MEM_LAYER_PAGE - 1);
			if (hole <= stop) {
				stop = end;
				break;
			}
			off_t n = hole < end ? lseek(l->fd, (off_t)hole, SEEK_DATA) : -1;
			uint64_t next = n < 0		    ? end
					: (uint64_t)n > end ? end
							    : (uint64_t)n & ~(MEM_LAYER_PAGE - 1);
			stop = hole;
			if (next - hole >= ZERO_RUN_MAP || hole >= end)
				break;
			stop = next;
		}
		if (stop <= off)
			stop = off + MEM_LAYER_PAGE;
		int r = pread_full(l->fd, dst, stop - off, (off_t)off);
		if (r)
			return r;
		dst += stop - off;
		off = stop;
	}
	return 0;
}

/*
 * Runs of at least this many pages (1 MiB) of an increment are mapped from its file (privately,
 * like the base), not read: a restore then costs about the same whether the increment is small
 * or holds everything the sandbox wrote since the last layer. Shorter runs are copied: they are
 * mostly the guest's scattered recent writes (kernel objects, page tables, freed and reused
 * pages), which its next requests write again, and a page copied in ahead costs no
 * copy-on-write fault then. In the KVM box, with 16 MiB dirtied before a stop, the first
 * reconnect took 530-611 ms at this size, 572-1009 ms at 16 pages and 830-1016 ms copying all.
 */
#define MAP_RUN_MIN  256
#define MAP_RUNS_MAX 4096

/* Whether pages [p, p+run) of layer `l` are one hole of at least ZERO_RUN_MAP (zero pages that
 * apply_run maps as fresh anonymous memory, not as page cache). */
static bool all_hole(const struct mem_layer *l, uint64_t p, uint64_t run)
{
	if (run * MEM_LAYER_PAGE < ZERO_RUN_MAP)
		return false;
	uint64_t off = l->info.data_off + p * MEM_LAYER_PAGE;
	off_t d = lseek(l->fd, (off_t)off, SEEK_DATA);
	return (d < 0 && errno == ENXIO) || (d >= 0 && (uint64_t)d >= off + run * MEM_LAYER_PAGE);
}

static int map_run(const struct mem_layer *l, uint8_t *ram, uint64_t p, uint64_t run)
{
	uint8_t *dst = ram + p * MEM_LAYER_PAGE;
	void *m = mmap(dst, run * MEM_LAYER_PAGE, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE, l->fd,
		       (off_t)(l->info.data_off + p * MEM_LAYER_PAGE));
	if (m == MAP_FAILED)
		return -errno;
	(void)madvise(dst, run * MEM_LAYER_PAGE, MADV_DONTDUMP);
	return 0;
}

int layer_set_apply(const struct layer_set *ls, uint8_t *ram, uint64_t *pages_copied)
{
	uint64_t copied = 0, mapped_runs = 0;
	for (int i = 1; i < ls->nr; i++) {
		const struct mem_layer *l = &ls->layers[i];
		uint64_t p = 0, n = l->info.nr_pages;
		while (p < n) {
			/* Skip empty bitmap words quickly: increments are sparse. */
			if (p % 64 == 0 && l->bitmap[p / 64] == 0) {
				p += 64;
				continue;
			}
			if (!mem_layer_has(l, p)) {
				p++;
				continue;
			}
			uint64_t run = 1;
			while (p + run < n && mem_layer_has(l, p + run))
				run++;
			bool mapped = run >= MAP_RUN_MIN && mapped_runs < MAP_RUNS_MAX &&
				      !all_hole(l, p, run) && map_run(l, ram, p, run) == 0;
			if (mapped) {
				mapped_runs++;
			} else {
				int r = apply_run(l, ram, p, run);
				if (r)
					return r;
				copied += run;
			}
			p += run;
		}
	}
	if (pages_copied)
		*pages_copied = copied;
	return 0;
}
