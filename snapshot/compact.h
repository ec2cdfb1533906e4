/* Chain compaction: merges a base and its increments into one new full layer, so chains stay short. */
#ifndef COVE_COMPACT_H
#define COVE_COMPACT_H

#include <stddef.h>

#include "snapshot/chain.h"

/*
 * Writes a new full layer equal to the chain's latest memory (base data copied extent by
 * extent, then each increment's pages in order), syncs it, and commits a chain of that one
 * layer (keeping the latest state file).  Layer files are never changed in place: clones may
 * map them.  On success *c is the new chain; the caller may delete files it no longer lists.
 * 0 or -errno with a message in `err`; on failure the old chain is untouched.
 */
int chain_compact(struct chain *c, char *err, size_t errlen);

#endif
