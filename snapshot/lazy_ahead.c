/* Lazy restore of encrypted layers: a helper thread decrypts runs of the chain's pages ahead of
 * the guest, so that the userfaultfd thread mostly copies pages that are already open. */
#include "snapshot/lazy_ahead.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "snapshot/lazy_window.h"
#include "vmm/vm.h"

struct lazy_ahead {
	struct vm *vm;
	const struct layer_set *ls;
	struct crypto_ctx *cc; /* the helper's own */
	uint8_t chain_id[16];
	uint64_t nr_pages;
	uint8_t *tags;
	int res[AHEAD_RUN];
	struct ahead_run slot[AHEAD_SLOTS];
	/* Under mu: slots [head, tail) are opened runs (indices mod AHEAD_SLOTS). */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint64_t head, tail;
	bool stop, finished;
	int efd;
	pthread_t th;
	bool started;
};

static void signal_ready(struct lazy_ahead *a)
{
	uint64_t one = 1;
	if (write(a->efd, &one, sizeof(one)) < 0) {
		/* the counter is only a wake-up: a full one wakes the reader as well */
	}
}

static void *helper(void *arg)
{
	struct lazy_ahead *a = arg;
	pthread_setname_np(pthread_self(), "cove-uffd-open");
	int hr = vm_thread_enter(a->vm, VM_THREAD_UFFD);
	uint64_t next = 0;
	struct lazy_src src = {a->cc, a->chain_id, a->ls, NULL, true};
	while (!hr) {
		uint64_t first, n;
		/* No filled bitmap: every stored run, whatever faults filled meanwhile. */
		if (!lazy_next_run(NULL, a->nr_pages, a->ls, next, AHEAD_RUN, &first, &n))
			break;
		pthread_mutex_lock(&a->mu);
		while (!a->stop && a->tail - a->head == AHEAD_SLOTS)
			pthread_cond_wait(&a->cv, &a->mu);
		bool stop = a->stop;
		pthread_mutex_unlock(&a->mu);
		if (stop)
			break;
		/* Slot tail is the helper's alone until it is published. */
		struct ahead_run *s = &a->slot[a->tail % AHEAD_SLOTS];
		lazy_open_run(&src, first, n, s->plain, a->tags, a->res);
		uint64_t good = 0;
		while (good < n && a->res[good] == 0)
			good++;
		s->first = first;
		s->count = n;
		s->good = good;
		/* A page that failed stays for its own fault, which stops the VM. */
		next = first + (good < n ? good + 1 : n);
		pthread_mutex_lock(&a->mu);
		a->tail++;
		pthread_mutex_unlock(&a->mu);
		signal_ready(a);
	}
	pthread_mutex_lock(&a->mu);
	a->finished = true;
	pthread_mutex_unlock(&a->mu);
	signal_ready(a);
	return NULL;
}

int lazy_ahead_start(struct lazy_ahead **out, struct vm *vm, const struct layer_set *ls,
		     const struct crypto_ctx *cc, const uint8_t chain_id[16], uint64_t nr_pages)
{
	struct lazy_ahead *a = calloc(1, sizeof(*a));
	*out = NULL;
	if (!a)
		return -ENOMEM;
	a->vm = vm;
	a->ls = ls;
	a->nr_pages = nr_pages;
	a->efd = -1;
	memcpy(a->chain_id, chain_id, 16);
	pthread_mutex_init(&a->mu, NULL);
	pthread_cond_init(&a->cv, NULL);
	int r = crypto_ctx_dup(cc, &a->cc);
	a->tags = malloc(AHEAD_RUN * CRYPTO_TAG_LEN);
	for (unsigned i = 0; i < AHEAD_SLOTS; i++) {
		a->slot[i].plain = aligned_alloc(4096, AHEAD_RUN * 4096ULL);
		if (!a->slot[i].plain)
			r = r ?: -ENOMEM;
	}
	if (!r && !a->tags)
		r = -ENOMEM;
	if (!r) {
		a->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (a->efd < 0)
			r = -errno;
	}
	if (!r)
		r = -pthread_create(&a->th, NULL, helper, a);
	if (r) {
		lazy_ahead_stop(a);
		return r;
	}
	a->started = true;
	*out = a;
	return 0;
}

int lazy_ahead_fd(const struct lazy_ahead *a)
{
	return a->efd;
}

const struct ahead_run *lazy_ahead_peek(struct lazy_ahead *a)
{
	uint64_t ready;
	if (read(a->efd, &ready, sizeof(ready)) < 0) {
		/* nothing counted since the last read: the state below says what there is */
	}
	pthread_mutex_lock(&a->mu);
	const struct ahead_run *s = a->head < a->tail ? &a->slot[a->head % AHEAD_SLOTS] : NULL;
	pthread_mutex_unlock(&a->mu);
	return s;
}

void lazy_ahead_pop(struct lazy_ahead *a)
{
	pthread_mutex_lock(&a->mu);
	if (a->head < a->tail)
		a->head++;
	pthread_cond_signal(&a->cv);
	pthread_mutex_unlock(&a->mu);
}

bool lazy_ahead_done(struct lazy_ahead *a)
{
	pthread_mutex_lock(&a->mu);
	bool done = a->finished && a->head == a->tail;
	pthread_mutex_unlock(&a->mu);
	return done;
}

void lazy_ahead_stop(struct lazy_ahead *a)
{
	if (!a)
		return;
	if (a->started) {
		pthread_mutex_lock(&a->mu);
		a->stop = true;
		pthread_cond_signal(&a->cv);
		pthread_mutex_unlock(&a->mu);
		pthread_join(a->th, NULL);
	}
	if (a->efd >= 0)
		close(a->efd);
	if (a->cc)
		crypto_ctx_free(a->cc);
	for (unsigned i = 0; i < AHEAD_SLOTS; i++)
		free(a->slot[i].plain);
	free(a->tags);
	pthread_mutex_destroy(&a->mu);
	pthread_cond_destroy(&a->cv);
	free(a);
}
