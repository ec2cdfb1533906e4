/* io_uring block back end: batched submits, short-transfer and -EAGAIN retry, fsync in the ring. */
#include "devices/blk_uring.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/uring_restrict.h"

#define BLK_RING_ENTRIES 256

#define ZERO_BUF_SIZE (1u << 20)

/* Zeros for WRITE_ZEROES where fallocate is unsupported: read-only, shared by every request. */
static const uint8_t zero_buf[ZERO_BUF_SIZE];

/*
 * io_uring bypasses seccomp: the ring is created disabled, limited to the opcodes this back end
 * submits (IORING_REGISTER_RESTRICTIONS), then enabled. Its eventfd is registered first.
 */
static int restrict_ring(struct io_uring *ring)
{
	static const uint8_t ops[] = {IORING_OP_READV,	   IORING_OP_WRITEV, IORING_OP_FSYNC,
				      IORING_OP_FALLOCATE, IORING_OP_WRITE,  IORING_OP_NOP};
	struct io_uring_restriction res[sizeof(ops)];
	memset(res, 0, sizeof(res));
	for (size_t i = 0; i < sizeof(ops); i++) {
		res[i].opcode = IORING_RESTRICTION_SQE_OP;
		res[i].sqe_op = ops[i];
	}
	return uring_restrict_enable(ring, res, (unsigned)sizeof(ops));
}

int blk_uring_open(struct blk_uring *b, const char *path, bool read_only)
{
	memset(b, 0, sizeof(*b));
	b->efd = -1;
	b->read_only = read_only;
	b->fd = open(path, (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC);
	if (b->fd < 0)
		return -errno;
	int r;
	struct stat st;
	if (fstat(b->fd, &st) < 0) {
		r = -errno;
		goto fail;
	}
	if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
		r = -EINVAL;
		goto fail;
	}
	off_t end = lseek(b->fd, 0, SEEK_END);
	if (end < 0) {
		r = -errno;
		goto fail;
	}
	b->size = (uint64_t)end;
	b->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (b->efd < 0) {
		r = -errno;
		goto fail;
	}
	r = io_uring_queue_init(BLK_RING_ENTRIES, &b->ring, IORING_SETUP_R_DISABLED);
	if (r < 0)
		goto fail;
	b->ring_ok = true;
	r = io_uring_register_eventfd(&b->ring, b->efd);
	if (r < 0)
		goto fail;
	r = restrict_ring(&b->ring);
	if (r < 0)
		goto fail;
	return 0;
fail:
	blk_uring_close(b);
	return r;
}

static struct io_uring_sqe *get_sqe(struct blk_uring *b)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&b->ring);
	if (!sqe) {
		/* The submission ring is full: push what is there and try once more. */
		blk_uring_submit(b);
		sqe = io_uring_get_sqe(&b->ring);
	}
	return sqe;
}

static int prep(struct blk_uring *b, struct blk_io *io)
{
	struct io_uring_sqe *sqe = get_sqe(b);
	if (!sqe)
		return -EBUSY;
	switch (io->op) {
	case BLK_OP_READ:
		io_uring_prep_readv(sqe, b->fd, io->iov, (unsigned)io->niov, io->offset);
		break;
	case BLK_OP_WRITE:
		io_uring_prep_writev(sqe, b->fd, io->iov, (unsigned)io->niov, io->offset);
		break;
	case BLK_OP_FLUSH:
		io_uring_prep_fsync(sqe, b->fd, IORING_FSYNC_DATASYNC);
		break;
	case BLK_OP_DISCARD:
		io_uring_prep_fallocate(sqe, b->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
					(off_t)io->offset, (off_t)io->len);
		break;
	case BLK_OP_WRITE_ZEROES:
		if (b->no_zero_range)
			io->zero_writes = true;
		if (io->zero_writes)
			io_uring_prep_write(sqe, b->fd, zero_buf,
					    io->len < ZERO_BUF_SIZE ? (unsigned)io->len
								    : ZERO_BUF_SIZE,
					    io->offset);
		else
			io_uring_prep_fallocate(
			    sqe, b->fd,
			    (io->unmap ? FALLOC_FL_PUNCH_HOLE : FALLOC_FL_ZERO_RANGE) |
				FALLOC_FL_KEEP_SIZE,
			    (off_t)io->offset, (off_t)io->len);
		break;
	}
	io_uring_sqe_set_data(sqe, io);
	b->inflight++;
	b->unsubmitted++;
	return 0;
}

int blk_uring_queue(struct blk_uring *b, struct blk_io *io)
{
	if (b->read_only &&
	    (io->op == BLK_OP_WRITE || io->op == BLK_OP_DISCARD || io->op == BLK_OP_WRITE_ZEROES))
		return -EROFS;
	if ((io->op == BLK_OP_READ || io->op == BLK_OP_WRITE || io->op == BLK_OP_WRITE_ZEROES) &&
	    io->len == 0)
		return -EINVAL;
	io->zero_writes = false;
	return prep(b, io);
}

/*
 * Fails every request still in the submission ring (the kernel never took them) with `err`:
 * each SQE becomes a NOP nobody waits for, so a later submit is harmless.
 */
static void fail_unsubmitted(struct blk_uring *b, int err)
{
	struct io_uring_sq *sq = &b->ring.sq;
	unsigned head = __atomic_load_n(sq->khead, __ATOMIC_ACQUIRE), tail = *sq->ktail;
	for (unsigned i = head; i != tail; i++) {
		struct io_uring_sqe *sqe = &sq->sqes[sq->array[i & sq->ring_mask]];
		struct blk_io *io = (struct blk_io *)(uintptr_t)sqe->user_data;
		io_uring_prep_nop(sqe);
		io_uring_sqe_set_data(sqe, NULL);
		if (!io)
			continue;
		b->inflight--;
		io->done(io, err);
	}
	b->unsubmitted = 0;
}

int blk_uring_submit(struct blk_uring *b)
{
	if (!b->unsubmitted)
		return 0;
	int r;
	do
		r = io_uring_submit(&b->ring);
	while (r == -EINTR);
	if (r >= 0) {
		b->unsubmitted -= (uint32_t)r < b->unsubmitted ? (uint32_t)r : b->unsubmitted;
		if (!b->unsubmitted)
			return 0;
		r = -EAGAIN; /* the kernel took only some */
	}
	/*
	 * Short of memory or with completions backed up (-EAGAIN, -EBUSY), a completion still in
	 * the kernel wakes the reaper, which submits again. With none in flight, nothing would
	 * ever come: fail the requests now, or a drain (reset, snapshot) would wait forever.
	 */
	if ((r == -EAGAIN || r == -EBUSY) && b->inflight > b->unsubmitted)
		return r;
	fail_unsubmitted(b, r);
	return r;
}

/* Drops `n` transferred bytes from the front of the iovec list. */
static void advance(struct blk_io *io, uint64_t n)
{
	io->offset += n;
	io->len -= n;
	while (n && io->niov) {
		if (n < io->iov->iov_len) {
			io->iov->iov_base = (uint8_t *)io->iov->iov_base + n;
			io->iov->iov_len -= n;
			return;
		}
		n -= io->iov->iov_len;
		io->iov++;
		io->niov--;
	}
}

/* Returns true when the request is finished (with *res set). */
static bool handle_result(struct blk_uring *b, struct blk_io *io, int r, int *res)
{
	if (r == -EAGAIN || r == -EINTR)
		return prep(b, io) ? (*res = r, true) : false;
	if (io->op == BLK_OP_WRITE_ZEROES && !io->zero_writes) {
		if (r == -EOPNOTSUPP) {
			/* tmpfs and others: no ZERO_RANGE; write zeros for this and later ones. */
			b->no_zero_range = true;
			io->zero_writes = true;
			return prep(b, io) ? (*res = r, true) : false;
		}
		*res = r < 0 ? r : 0;
		return true;
	}
	if (r < 0) {
		*res = r;
		return true;
	}
	if (io->op == BLK_OP_WRITE_ZEROES) {
		if (r == 0 || (uint64_t)r > io->len) {
			*res = -EIO;
			return true;
		}
		io->offset += (uint64_t)r;
		io->len -= (uint64_t)r;
		if (io->len == 0) {
			*res = 0;
			return true;
		}
		return prep(b, io) ? (*res = -EIO, true) : false;
	}
	if (io->op != BLK_OP_READ && io->op != BLK_OP_WRITE) {
		*res = 0;
		return true;
	}
	if (r == 0 || (uint64_t)r > io->len) {
		*res = -EIO; /* end of file inside the disk (the image shrank), or nonsense */
		return true;
	}
	advance(io, (uint64_t)r);
	if (io->len == 0) {
		*res = 0;
		return true;
	}
	/* A short transfer: continue where it stopped. */
	return prep(b, io) ? (*res = -EIO, true) : false;
}

void blk_uring_reap(struct blk_uring *b)
{
	uint64_t v;
	if (read(b->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		return;
	struct io_uring_cqe *cqe;
	while (io_uring_peek_cqe(&b->ring, &cqe) == 0) {
		struct blk_io *io = io_uring_cqe_get_data(cqe);
		int r = cqe->res;
		io_uring_cqe_seen(&b->ring, cqe);
		if (!io)
			continue; /* a request fail_unsubmitted() already finished */
		b->inflight--;
		int res;
		if (handle_result(b, io, r, &res))
			io->done(io, res);
	}
	blk_uring_submit(b);
}

/* Finishes whatever completed; with `cancel`, every request as -ECANCELED (the device goes). */
static void reap_cancel(struct blk_uring *b)
{
	struct io_uring_cqe *cqe;
	while (io_uring_peek_cqe(&b->ring, &cqe) == 0) {
		struct blk_io *io = io_uring_cqe_get_data(cqe);
		io_uring_cqe_seen(&b->ring, cqe);
		if (!io)
			continue;
		b->inflight--;
		io->done(io, -ECANCELED);
	}
}

/*
 * Waits until nothing is in flight. Requests the kernel never took are failed by
 * blk_uring_submit(); a ring that stops answering fails the rest, so this always returns.
 */
static void wait_all(struct blk_uring *b, bool cancel)
{
	blk_uring_submit(b);
	while (b->inflight) {
		/* Anything the kernel did not take is taken now, or failed (and off inflight). */
		if (b->unsubmitted)
			blk_uring_submit(b);
		if (!b->inflight)
			break;
		struct io_uring_cqe *cqe;
		int r = io_uring_wait_cqe(&b->ring, &cqe);
		if (r == -EINTR)
			continue;
		if (r < 0) {
			/* The kernel will not say more: what it has is lost to us. */
			fail_unsubmitted(b, r);
			if (b->inflight)
				break;
			continue;
		}
		if (cancel)
			reap_cancel(b);
		else
			blk_uring_reap(b);
	}
}

void blk_uring_close(struct blk_uring *b)
{
	if (b->ring_ok) {
		/* The kernel may still be writing into buffers the callers own: let it finish. */
		wait_all(b, true);
		io_uring_queue_exit(&b->ring);
		b->ring_ok = false;
	}
	if (b->efd >= 0)
		close(b->efd);
	if (b->fd >= 0)
		close(b->fd);
	b->efd = b->fd = -1;
}

void blk_uring_drain(struct blk_uring *b)
{
	if (b->ring_ok)
		wait_all(b, false);
}
