/* Writes a list of extents from one staging buffer to a file: io_uring (batched, registered
 * buffers) or a pwrite loop. */
#ifndef COVE_LAYER_WRITE_H
#define COVE_LAYER_WRITE_H

#include <stddef.h>
#include <stdint.h>

struct write_extent {
	uint64_t file_off;
	uint64_t buf_off; /* into the staging buffer */
	uint64_t len;
};

enum write_method { WRITE_URING = 0, WRITE_PWRITE = 1 };

/* Called after every completed batch with bytes written so far (progress); may be NULL. */
typedef void (*write_progress_fn)(void *opaque, uint64_t done, uint64_t total);

/*
 * Writes every extent.  With WRITE_URING the buffer is registered with the ring (in pieces of
 * at most 1 GiB) and extents go out as WRITE_FIXED, up to 64 in flight; short writes continue
 * where they stopped.  0 or -errno.
 */
int layer_write_extents(int fd, enum write_method m, uint8_t *buf, size_t buf_len,
			const struct write_extent *ext, size_t n, write_progress_fn progress,
			void *opaque);

/*
 * Readies extents [e0, e1) of the buffer before they are written (seals them in place, say):
 * 0 or -errno, which ends the write with that error.
 */
typedef int (*write_prepare_fn)(void *opaque, size_t e0, size_t e1);

/*
 * A writer's ring made once, before the process's seccomp filter forbids io_uring_setup: it
 * is restricted like a per-call ring (writes to fixed files only) and may afterwards only
 * swap its one fixed file and (un)register the staging buffer. 0 or -errno.
 */
struct layer_ring;
int layer_ring_new(struct layer_ring **out);
void layer_ring_free(struct layer_ring *lr);
/* layer_write_extents through lr (NULL: a ring of its own, as layer_write_extents). */
int layer_write_extents_ring(struct layer_ring *lr, int fd, enum write_method m, uint8_t *buf,
			     size_t buf_len, const struct write_extent *ext, size_t n,
			     write_progress_fn progress, void *opaque);

/*
 * As layer_write_extents_ring, in batches of about `batch` bytes of whole extents (at least one
 * each): prepare(popaque, e0, e1) readies a batch just before its requests go out, so with
 * io_uring the CPU readies the next batch while the batches before it are being written. With
 * WRITE_PWRITE, batch after batch. The first error of prepare's or the writes'; everything in
 * flight has completed when it returns.
 */
int layer_write_extents_prepared(struct layer_ring *lr, int fd, enum write_method m,
				 uint8_t *buf, size_t buf_len, const struct write_extent *ext,
				 size_t n, uint64_t batch, write_prepare_fn prepare, void *popaque,
				 write_progress_fn progress, void *opaque);

#endif
