/* Opening a chain's memory layers for restore: validation, then RAM = base mapped privately + increments copied in. */
#ifndef COVE_LAYER_RESTORE_H
#define COVE_LAYER_RESTORE_H

#include <stddef.h>
#include <stdint.h>

#include "snapshot/chain.h"
#include "snapshot/mem_layer.h"

struct layer_set {
	int nr;
	struct mem_layer layers[CHAIN_MAX_LAYERS]; /* [0] is the full base */
};

/*
 * Opens layers 0..upto of the chain and checks each against chain.json and its parent
 * (ids, chain id, RAM size, full/increment) and its own file (header, bitmap, size).
 * 0 or -errno with a one-line message in `err`.
 */
int layer_set_open(struct layer_set *ls, const struct chain *c, int upto, char *err,
		   size_t errlen);
void layer_set_close(struct layer_set *ls);
/*
 * Copies the increments' pages over RAM whose base layer is already mapped at `ram`
 * (cost follows the pages the increments hold, not the RAM size). 0 or -errno.
 */
int layer_set_apply(const struct layer_set *ls, uint8_t *ram, uint64_t *pages_copied);

#endif
