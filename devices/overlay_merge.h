/* Merging an overlay chain's frozen layers into one new frozen layer (devices/OVERLAY.md). */
#ifndef COVE_OVERLAY_MERGE_H
#define COVE_OVERLAY_MERGE_H

#include <stddef.h>
#include <stdint.h>

#include "devices/overlay.h"

/* Frozen layers a snapshot's chain reaches before its next commit merges them (OVERLAY.md). */
#define OVERLAY_MERGE_AT 8

/* A merged layer built from layers[0..nr_src-1] of an overlay, not yet in its chain. */
struct overlay_merged {
	int nr_src;		    /* the frozen layers it stands for: layers[0..nr_src-1] */
	uint32_t src_top_crc;	    /* map CRC of layers[nr_src-1] when it was built */
	uint64_t chunks;	    /* chunks it holds */
	struct overlay_layer layer; /* depth 0; data_fd < 0: none */
};

/*
 * Writes every frozen layer of `ov` as one new frozen layer at `path` (data) and `path`.map,
 * both new files (O_CREAT|O_EXCL beneath their directory fd): each chunk from the newest layer
 * holding it, chunks no layer holds left as holes, a plain chunk of zeros left a hole too (its
 * bit still set). Depth 0, no parent. With `sealer` the layer is sealed (map version 3) under
 * `layer_id` and a fresh salt; without one every source layer must be plain. The top and the
 * layers are only read (the frozen layers never change), so the guest's I/O may go on meanwhile
 * on another thread; only overlay_merge_install changes the chain. 0, or -errno with a one-line
 * message in `err` (nothing of the chain changes; the new files stay behind, unreferenced).
 */
int overlay_merge_build(struct overlay *ov, const char *path, const struct overlay_sealer *sealer,
			uint64_t layer_id, struct overlay_merged *m, char *err, size_t errlen);
/*
 * Puts a built merge in the place of the layers it stands for: they are closed, the merged
 * layer becomes layer 0 and the top's map names it as its parent (depth 1, rewritten in place
 * through its fd after a data sync). Only when the chain is still the one it was built from (no
 * freeze since): -ESTALE otherwise, and nothing changes. On success `m` is emptied.
 */
int overlay_merge_install(struct overlay *ov, struct overlay_merged *m, char *err, size_t errlen);
/* Closes a merge that was not installed (its files stay: nothing refers to them). */
void overlay_merged_free(struct overlay_merged *m);

#endif
