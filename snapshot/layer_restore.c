/* Opening a chain's memory layers for restore: validation, then RAM = base mapped privately + increments copied in. */
#include "snapshot/layer_restore.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/file_io.h"
#include "common/errmsg.h"

int layer_set_open(struct layer_set *ls, const struct chain *c, int upto, char *err,
		   size_t errlen)
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

int layer_set_apply(const struct layer_set *ls, uint8_t *ram, uint64_t *pages_copied)
{
	uint64_t copied = 0;
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
			int r = pread_full(l->fd, ram + p * MEM_LAYER_PAGE, run * MEM_LAYER_PAGE,
						(off_t)(l->info.data_off + p * MEM_LAYER_PAGE));
			if (r)
				return r;
			copied += run;
			p += run;
		}
	}
	if (pages_copied)
		*pages_copied = copied;
	return 0;
}
