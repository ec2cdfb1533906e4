/* Writing an encrypted memory layer while it is sealed: the cipher runs ahead of io_uring. */
#ifndef COVE_SEAL_WRITE_H
#define COVE_SEAL_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "snapshot/layer_seal.h"
#include "snapshot/layer_write.h"

/* Bytes per batch: small enough that the disk starts early, large enough that a batch's
 * requests keep the ring's queue busy. */
#define SEAL_BATCH (1ULL << 20)

/*
 * Seals the job's pages and writes them to fd, then their tag blocks, in batches of about
 * `batch` bytes: a batch goes to the ring as soon as it is sealed, and the next is sealed while
 * the ones before it are written (layer_write_extents_prepared). With helpers > 0 (at most 1
 * today), a helper thread with a context of its own seals ahead of the writer, and the writer
 * seals whatever the helper has not reached. j->buf is the staging buffer of buf_len bytes.
 * 0 or -errno; nothing is in flight when it returns.
 */
int layer_seal_write(struct layer_ring *lr, int fd, enum write_method m, const struct seal_job *j,
		     size_t buf_len, uint64_t batch, unsigned helpers, write_progress_fn progress,
		     void *opaque);

#endif
