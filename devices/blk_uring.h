/* Block back end: a raw image file driven through io_uring, completions signalled on an eventfd. */
#ifndef COVE_BLK_URING_H
#define COVE_BLK_URING_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include <liburing.h>

enum blk_op { BLK_OP_READ, BLK_OP_WRITE, BLK_OP_FLUSH, BLK_OP_DISCARD, BLK_OP_WRITE_ZEROES };

struct blk_io;
/* res is 0 when every byte was transferred, else -errno. */
typedef void (*blk_io_done)(struct blk_io *io, int res);

/* One request; the caller owns it (and the iovec array, which the back end advances) until done. */
struct blk_io {
	enum blk_op op;
	uint64_t offset;
	uint64_t len;	   /* bytes left (READ/WRITE/DISCARD/WRITE_ZEROES) */
	struct iovec *iov; /* READ/WRITE */
	int niov;
	bool unmap;	    /* WRITE_ZEROES: a hole punch is allowed */
	bool zero_writes;   /* WRITE_ZEROES: fallocate is unsupported, writing zero buffers */
	blk_io_done done;
};

struct blk_uring {
	struct io_uring ring;
	bool ring_ok;
	int fd;
	int efd; /* eventfd io_uring signals on every completion */
	uint64_t size;
	bool read_only;
	uint32_t inflight;
	uint32_t unsubmitted;
	bool no_zero_range; /* fallocate said EOPNOTSUPP once: write zeros from then on */
};

/* Opens `path` (O_RDONLY when read_only) and sets up the ring. 0 or -errno. */
int blk_uring_open(struct blk_uring *b, const char *path, bool read_only);
/*
 * Queues a request; it reaches the kernel at the next blk_uring_submit(). 0 or -errno.
 * WRITE_ZEROES is fallocate(ZERO_RANGE), or PUNCH_HOLE with `unmap`; once the filesystem says
 * -EOPNOTSUPP, zero buffers are written instead (for that request and every later one).
 */
int blk_uring_queue(struct blk_uring *b, struct blk_io *io);
/* Hands every queued request to the kernel in one system call. */
int blk_uring_submit(struct blk_uring *b);
/* Called when efd is readable: finishes completed requests (resubmitting short or -EAGAIN ones). */
void blk_uring_reap(struct blk_uring *b);
/* Waits for in-flight requests, then closes everything. */
void blk_uring_close(struct blk_uring *b);

/* Waits until no request is in flight, finishing each as reap would (snapshots quiesce disks). */
void blk_uring_drain(struct blk_uring *b);

#endif
