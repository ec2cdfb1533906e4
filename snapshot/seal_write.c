/* Writing an encrypted memory layer while it is sealed: the cipher runs ahead of io_uring. */
#include "snapshot/seal_write.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

enum { FREE, CLAIMED, SEALED, FAILED };

/* The extents of one layer, each sealed once by whichever thread claims it first. */
struct ahead {
	struct seal_plan *sp;
	size_t n;
	_Atomic unsigned char *state;
	atomic_bool stop;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct crypto_ctx *cc; /* the helper's */
	int err;	       /* the helper's first error, under mu */
};

static int seal_one(struct ahead *a, struct crypto_ctx *cc, size_t e)
{
	unsigned char want = FREE;
	if (!atomic_compare_exchange_strong(&a->state[e], &want, CLAIMED))
		return 1; /* the other thread has it */
	int r = layer_seal_extents(a->sp, cc, e, e + 1);
	pthread_mutex_lock(&a->mu);
	atomic_store(&a->state[e], r ? FAILED : SEALED);
	if (r && !a->err)
		a->err = r;
	pthread_cond_broadcast(&a->cv);
	pthread_mutex_unlock(&a->mu);
	return r;
}

static void *helper(void *arg)
{
	struct ahead *a = arg;
	for (size_t e = 0; e < a->n && !atomic_load(&a->stop); e++)
		if (seal_one(a, a->cc, e) < 0)
			break;
	return NULL;
}

/* The writer's prepare: extents [e0, e1) sealed, by this thread where the helper is not. */
static int ready(void *opaque, size_t e0, size_t e1)
{
	struct ahead *a = opaque;
	for (size_t e = e0; e < e1; e++) {
		int r = seal_one(a, NULL, e);
		if (r < 0)
			return r;
		if (r == 0)
			continue;
		pthread_mutex_lock(&a->mu);
		while (atomic_load(&a->state[e]) == CLAIMED)
			pthread_cond_wait(&a->cv, &a->mu);
		r = atomic_load(&a->state[e]) == FAILED ? (a->err ? a->err : -EIO) : 0;
		pthread_mutex_unlock(&a->mu);
		if (r)
			return r;
	}
	return 0;
}

int layer_seal_write(struct layer_ring *lr, int fd, enum write_method m, const struct seal_job *j,
		     size_t buf_len, uint64_t batch, unsigned helpers, write_progress_fn progress,
		     void *opaque)
{
	struct seal_tags t;
	struct ahead a = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
	const struct write_extent *ext;
	pthread_t th;
	bool started = false;
	int r = layer_seal_begin(j, batch, &t, &a.sp, &ext, &a.n);
	if (r)
		return r;
	a.state = calloc(a.n ? a.n : 1, sizeof(*a.state));
	if (!a.state) {
		r = -ENOMEM;
		goto out;
	}
	/* No helper is no error: the writer then seals every batch itself. */
	if (helpers && a.n > 1 && layer_seal_ctx(j, &a.cc) == 0)
		started = pthread_create(&th, NULL, helper, &a) == 0;
	r = layer_write_extents_prepared(lr, fd, m, j->buf, buf_len, ext, a.n, batch, ready, &a,
					 progress, opaque);
	if (started) {
		atomic_store(&a.stop, true);
		pthread_join(th, NULL);
	}
	if (!r && t.n)
		r = layer_write_extents_ring(lr, fd, m, t.buf, t.len, t.ext, t.n, NULL, NULL);
out:
	if (a.cc)
		crypto_ctx_free(a.cc);
	free(a.state);
	layer_seal_end(a.sp);
	seal_tags_free(&t);
	return r;
}
