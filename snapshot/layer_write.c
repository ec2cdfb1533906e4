/* Writes a list of extents from one staging buffer to a file: io_uring (batched, registered
 * buffers) or a pwrite loop. */
#include "snapshot/layer_write.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include <liburing.h>

#include "common/uring_restrict.h"
#include "common/file_io.h"

#define QUEUE_DEPTH 64

/* The kernel caps one registered buffer at 1 GiB. */
#define REG_PIECE (1ULL << 30)
/* Larger extents are split so one request never spans two registered pieces. */
#define MAX_IO (1ULL << 20)

/* One request: a piece of an extent that stays inside one registered buffer. */
struct wreq {
	uint64_t file_off, buf_off, len;
};

static int prep(struct io_uring *ring, const struct wreq *w, uint8_t *buf, bool fixed)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
	if (!sqe)
		return -EBUSY;
	if (fixed)
		io_uring_prep_write_fixed(sqe, 0, buf + w->buf_off, (unsigned)w->len, w->file_off,
					  (int)(w->buf_off / REG_PIECE));
	else
		io_uring_prep_write(sqe, 0, buf + w->buf_off, (unsigned)w->len, w->file_off);
	sqe->flags |= IOSQE_FIXED_FILE;
	io_uring_sqe_set_data(sqe, (void *)w);
	return 0;
}

/*
 * Splits the extents into requests, each inside one registered piece and at most MAX_IO; with
 * first (n + 1 entries), extent i's requests are [first[i], first[i + 1]).
 */
static int split_requests(const struct write_extent *ext, size_t n, struct wreq **out, size_t *nout,
			  size_t *first)
{
	size_t nreq = 0, cap = n + 16;
	struct wreq *reqs = malloc(cap * sizeof(*reqs));
	if (!reqs)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		uint64_t off = 0;
		if (first)
			first[i] = nreq;
		while (off < ext[i].len) {
			uint64_t b = ext[i].buf_off + off;
			uint64_t piece_end = (b / REG_PIECE + 1) * REG_PIECE;
			uint64_t len = ext[i].len - off;
			if (len > piece_end - b)
				len = piece_end - b;
			if (len > MAX_IO)
				len = MAX_IO;
			if (nreq == cap) {
				cap *= 2;
				struct wreq *nr = realloc(reqs, cap * sizeof(*reqs));
				if (!nr) {
					free(reqs);
					return -ENOMEM;
				}
				reqs = nr;
			}
			reqs[nreq++] = (struct wreq){ext[i].file_off + off, b, len};
			off += len;
		}
	}
	if (first)
		first[n] = nreq;
	*out = reqs;
	*nout = nreq;
	return 0;
}

/*
 * Registration pins the pages; if the memlock limit refuses, plain writes still work. Only a
 * staging-sized buffer is registered: pinning all of guest RAM (the unstaged path) would make
 * every page of it resident. True when the buffer is registered.
 */
static bool register_buffer(struct io_uring *ring, uint8_t *buf, size_t buf_len)
{
	size_t npieces = (buf_len + REG_PIECE - 1) / REG_PIECE;
	if (!npieces || buf_len > REG_PIECE)
		return false;
	struct iovec iov = {buf, buf_len};
	return io_uring_register_buffers(ring, &iov, 1) == 0;
}

/* Requests going through a ring (file: fixed file 0), short writes sent again. */
struct pump {
	struct io_uring *ring;
	struct wreq *reqs;
	uint8_t *buf;
	bool fixed;
	size_t next, inflight;
	uint64_t done, total;
	write_progress_fn progress;
	void *opaque;
};

/*
 * Sends requests [next, avail) as the queue has room and reaps what completed; waits for a
 * completion when wait is set or the queue is full with requests left. 0 or -errno.
 */
static int pump_step(struct pump *p, size_t avail, bool wait)
{
	int r = 0;
	while (p->next < avail && p->inflight < QUEUE_DEPTH) {
		r = prep(p->ring, &p->reqs[p->next], p->buf, p->fixed);
		if (r)
			break;
		p->next++;
		p->inflight++;
	}
	bool full = p->next < avail && p->inflight >= QUEUE_DEPTH;
	r = (wait || full) && p->inflight ? io_uring_submit_and_wait(p->ring, 1)
					  : io_uring_submit(p->ring);
	if (r < 0 && r != -EINTR)
		return r;
	struct io_uring_cqe *cqe;
	unsigned head, seen = 0;
	r = 0;
	io_uring_for_each_cqe(p->ring, head, cqe)
	{
		struct wreq *w = io_uring_cqe_get_data(cqe);
		int res = cqe->res;
		seen++;
		p->inflight--;
		if (res < 0 && res != -EAGAIN && res != -EINTR) {
			r = res;
			continue;
		}
		if (res <= 0 && res != -EAGAIN && res != -EINTR) {
			r = -EIO;
			continue;
		}
		if (res > 0) {
			w->file_off += (uint64_t)res;
			w->buf_off += (uint64_t)res;
			w->len -= (uint64_t)res;
			p->done += (uint64_t)res;
		}
		if (w->len && !r) { /* short write or EAGAIN: send the rest again */
			if (prep(p->ring, w, p->buf, p->fixed) == 0)
				p->inflight++;
			else
				r = -EIO;
		}
	}
	io_uring_cq_advance(p->ring, seen);
	if (!r && seen && p->progress)
		p->progress(p->opaque, p->done, p->total);
	return r;
}

/* Waits for what is still in flight, before the buffer may go away. */
static void pump_drain(struct pump *p)
{
	io_uring_submit(p->ring);
	while (p->inflight) {
		struct io_uring_cqe *cqe;
		if (io_uring_wait_cqe(p->ring, &cqe) < 0)
			break;
		io_uring_cqe_seen(p->ring, cqe);
		p->inflight--;
	}
}

/* One call's work: the extents of a buffer, and what readies them (prepare: may be NULL). */
struct wjob {
	uint8_t *buf;
	size_t buf_len;
	const struct write_extent *ext;
	size_t n;
	uint64_t batch;
	write_prepare_fn prepare;
	void *popaque;
	write_progress_fn progress;
	void *opaque;
	uint64_t total;
};

/*
 * Every request through the ring; with prepare, in batches of about `batch` bytes of extents,
 * each readied by prepare(popaque, e0, e1) just before its requests go out, while the batches
 * before it are still being written.
 */
static int submit_all(struct io_uring *ring, const struct wjob *j, bool fixed)
{
	struct wreq *reqs;
	size_t nreq, *first = calloc(j->n + 1, sizeof(size_t));
	int r = first ? split_requests(j->ext, j->n, &reqs, &nreq, first) : -ENOMEM;
	if (r) {
		free(first);
		return r;
	}
	struct pump p = {ring, reqs, j->buf, fixed, 0, 0, 0, j->total, j->progress, j->opaque};
	size_t e = 0, avail = j->prepare ? 0 : nreq;
	if (!j->prepare)
		e = j->n;
	while (!r && (e < j->n || p.next < nreq || p.inflight)) {
		if (e < j->n) {
			/* The CPU readies the next batch while the ring writes the ones before. */
			size_t e1 = e;
			uint64_t bytes = 0;
			while (e1 < j->n && (e1 == e || bytes + j->ext[e1].len <= j->batch))
				bytes += j->ext[e1++].len;
			r = j->prepare(j->popaque, e, e1);
			e = e1;
			avail = first[e];
			if (r)
				break;
		}
		r = pump_step(&p, avail, e == j->n);
	}
	pump_drain(&p);
	free(first);
	free(reqs);
	return r < 0 ? r : 0;
}

/* Only writes, only to fixed files: a ring cannot touch another fd of this process. */
static void write_restrictions(struct io_uring_restriction res[3])
{
	memset(res, 0, 3 * sizeof(*res));
	res[0] = (struct io_uring_restriction){.opcode = IORING_RESTRICTION_SQE_OP,
					       .sqe_op = IORING_OP_WRITE};
	res[1] = (struct io_uring_restriction){.opcode = IORING_RESTRICTION_SQE_OP,
					       .sqe_op = IORING_OP_WRITE_FIXED};
	res[2] = (struct io_uring_restriction){.opcode = IORING_RESTRICTION_SQE_FLAGS_REQUIRED,
					       .sqe_flags = IOSQE_FIXED_FILE};
}

/* A ring of its own for one call: the file registered as fixed file 0. */
static int write_uring(int fd, const struct wjob *j)
{
	struct io_uring ring;
	/* io_uring bypasses seccomp: created disabled, restricted below, then enabled. */
	int r = io_uring_queue_init(QUEUE_DEPTH, &ring, IORING_SETUP_R_DISABLED);
	if (r < 0)
		return r;
	r = io_uring_register_files(&ring, &fd, 1);
	if (r < 0)
		goto out;
	bool fixed = register_buffer(&ring, j->buf, j->buf_len);
	struct io_uring_restriction res[3];
	write_restrictions(res);
	r = uring_restrict_enable(&ring, res, 3);
	if (!r)
		r = submit_all(&ring, j, fixed);
	if (fixed)
		io_uring_unregister_buffers(&ring);
out:
	io_uring_queue_exit(&ring);
	return r < 0 ? r : 0;
}

struct layer_ring {
	struct io_uring ring;
};

int layer_ring_new(struct layer_ring **out)
{
	struct layer_ring *lr = calloc(1, sizeof(*lr));
	if (!lr)
		return -ENOMEM;
	int r = io_uring_queue_init(QUEUE_DEPTH, &lr->ring, IORING_SETUP_R_DISABLED);
	if (r < 0) {
		free(lr);
		return r;
	}
	/*
	 * One empty fixed-file slot: each layer file goes in for its write and out after. The
	 * ring keeps, after it is enabled, only the registrations that does (and the staging
	 * buffer's): no other register operation, and SQEs as write_uring's.
	 */
	r = io_uring_register_files_sparse(&lr->ring, 1);
	struct io_uring_restriction res[6];
	write_restrictions(res);
	res[3] = (struct io_uring_restriction){.opcode = IORING_RESTRICTION_REGISTER_OP,
					       .register_op = IORING_REGISTER_FILES_UPDATE};
	res[4] = (struct io_uring_restriction){.opcode = IORING_RESTRICTION_REGISTER_OP,
					       .register_op = IORING_REGISTER_BUFFERS};
	res[5] = (struct io_uring_restriction){.opcode = IORING_RESTRICTION_REGISTER_OP,
					       .register_op = IORING_UNREGISTER_BUFFERS};
	if (!r)
		r = uring_restrict_enable(&lr->ring, res, 6);
	if (r < 0) {
		io_uring_queue_exit(&lr->ring);
		free(lr);
		return r;
	}
	*out = lr;
	return 0;
}

void layer_ring_free(struct layer_ring *lr)
{
	if (!lr)
		return;
	io_uring_queue_exit(&lr->ring);
	free(lr);
}

static int write_ring(struct layer_ring *lr, int fd, const struct wjob *j)
{
	int r = io_uring_register_files_update(&lr->ring, 0, &fd, 1);
	if (r < 0)
		return r;
	bool fixed = register_buffer(&lr->ring, j->buf, j->buf_len);
	r = submit_all(&lr->ring, j, fixed);
	if (fixed)
		io_uring_unregister_buffers(&lr->ring);
	int none = -1; /* the slot lets the file go */
	io_uring_register_files_update(&lr->ring, 0, &none, 1);
	return r;
}

/* The pwrite loop, batch by batch when there is something to ready first. */
static int write_pwrite(int fd, const struct wjob *j)
{
	uint64_t done = 0;
	size_t e = 0;
	while (e < j->n) {
		size_t e1 = e;
		uint64_t bytes = 0;
		while (e1 < j->n && (e1 == e || !j->prepare || bytes + j->ext[e1].len <= j->batch))
			bytes += j->ext[e1++].len;
		int r = j->prepare ? j->prepare(j->popaque, e, e1) : 0;
		for (size_t i = e; i < e1 && !r; i++) {
			r = pwrite_full(fd, j->buf + j->ext[i].buf_off, j->ext[i].len,
					(off_t)j->ext[i].file_off);
			done += j->ext[i].len;
			if (!r && j->progress && (i % 1024 == 1023 || i + 1 == j->n))
				j->progress(j->opaque, done, j->total);
		}
		if (r)
			return r;
		e = e1;
	}
	return 0;
}

static int write_job(struct layer_ring *lr, int fd, enum write_method m, struct wjob *j)
{
	j->total = 0;
	for (size_t i = 0; i < j->n; i++) {
		if (j->ext[i].buf_off > j->buf_len ||
		    j->ext[i].len > j->buf_len - j->ext[i].buf_off)
			return -EINVAL;
		j->total += j->ext[i].len;
	}
	if (m == WRITE_PWRITE)
		return write_pwrite(fd, j);
	if (lr)
		return write_ring(lr, fd, j);
	return write_uring(fd, j);
}

int layer_write_extents_ring(struct layer_ring *lr, int fd, enum write_method m, uint8_t *buf,
			     size_t buf_len, const struct write_extent *ext, size_t n,
			     write_progress_fn progress, void *opaque)
{
	struct wjob j = {buf, buf_len, ext, n, 0, NULL, NULL, progress, opaque, 0};
	return write_job(lr, fd, m, &j);
}

int layer_write_extents_prepared(struct layer_ring *lr, int fd, enum write_method m, uint8_t *buf,
				 size_t buf_len, const struct write_extent *ext, size_t n,
				 uint64_t batch, write_prepare_fn prepare, void *popaque,
				 write_progress_fn progress, void *opaque)
{
	struct wjob j = {buf, buf_len, ext, n, batch, prepare, popaque, progress, opaque, 0};
	return write_job(lr, fd, m, &j);
}

int layer_write_extents(int fd, enum write_method m, uint8_t *buf, size_t buf_len,
			const struct write_extent *ext, size_t n, write_progress_fn progress,
			void *opaque)
{
	return layer_write_extents_ring(NULL, fd, m, buf, buf_len, ext, n, progress, opaque);
}
