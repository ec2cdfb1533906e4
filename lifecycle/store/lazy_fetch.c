/* The fetcher of memory layers still arriving from the store (lazy_fetch.h). */
#include "lifecycle/store/lazy_fetch.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/errmsg.h"
#include "common/log.h"
#include "lifecycle/lazy_files.h"
#include "lifecycle/lock.h"
#include "lifecycle/store_stats.h"
#include "lifecycle/store/lazy_blob.h"
#include "lifecycle/store/s3.h"
#include "lifecycle/store/store_config.h"
#include "lifecycle/vmm_args.h"
#include "snapshot/lazy_gate.h"

enum { CH_MISSING, CH_BUSY, CH_HERE };

struct lf_file {
	struct lazy_blob b;
	int fd;
	uint8_t *state; /* per chunk */
	uint64_t next;	/* the background's next chunk to look at */
};

struct lf {
	const struct lazy_fetch_opts *o;
	struct sbx_lazy *rec;
	struct lf_file *files;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint64_t missing; /* chunks not yet here */
	bool stop;	  /* workers: leave */
	int fatal;	  /* a chunk that failed its digest: the copy cannot become whole */
	char fatal_msg[512];
	struct lazy_fetch_stats *st;
	uint64_t unflushed;  /* fetched bytes not yet in store-stats.json */
	int64_t last_demand; /* ms (monotonic) of the VMM's last request for a missing chunk */
};

/*
 * The background gives way to the guest: while the VMM asks for missing chunks (a restore's
 * first burst, an exec's), the workers wait, so the store's bandwidth goes to what the guest
 * waits for; they fetch once it has been quiet this long.
 */
#define LAZY_DEMAND_QUIET_MS 300

static int64_t now_ms(void)
{
	return (int64_t)(mono_us() / 1000);
}

static void flush_stats(struct lf *f)
{
	pthread_mutex_lock(&f->mu);
	uint64_t n = f->unflushed;
	f->unflushed = 0;
	pthread_mutex_unlock(&f->mu);
	if (n)
		store_stats_add(f->o->sbx_dfd, &(struct store_stats){.fetched_bytes = n});
}

/* Fetches chunk k of file i (marked CH_BUSY by the caller): CH_HERE, or back to CH_MISSING. */
static int fetch(struct lf *f, struct s3_client *c, size_t i, uint64_t k, uint8_t *buf, char *err,
		 size_t errlen)
{
	struct lf_file *lf = &f->files[i];
	uint64_t got = 0;
	int r = lazy_blob_fetch_chunk(c, &lf->b, k, buf, lf->fd, &got, err, errlen);
	pthread_mutex_lock(&f->mu);
	if (!r) {
		lf->state[k] = CH_HERE;
		f->missing--;
		f->st->fetched_chunks++;
		f->st->fetched_bytes += got;
		f->unflushed += got;
	} else {
		lf->state[k] = CH_MISSING;
		f->st->failures++;
		if (r == -EILSEQ && !f->fatal) {
			f->fatal = r;
			snprintf(f->fatal_msg, sizeof(f->fatal_msg), "%s", err);
		}
	}
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
	flush_stats(f); /* store-stats.json says what came so far (cove metrics, benches) */
	return r;
}

/* The next missing chunk for the background, lowest first (under mu): false when none. */
static bool next_missing(struct lf *f, size_t *fi, uint64_t *k)
{
	for (size_t i = 0; i < f->rec->n; i++) {
		struct lf_file *lf = &f->files[i];
		while (lf->next < lf->b.nchunks && lf->state[lf->next] != CH_MISSING)
			lf->next++;
		if (lf->next < lf->b.nchunks) {
			*fi = i;
			*k = lf->next;
			return true;
		}
	}
	/* Chunks handed back after a failure lie behind `next`: start over. */
	for (size_t i = 0; i < f->rec->n; i++)
		for (uint64_t q = 0; q < f->files[i].b.nchunks; q++)
			if (f->files[i].state[q] == CH_MISSING) {
				*fi = i;
				*k = q;
				return true;
			}
	return false;
}

struct worker {
	struct lf *f;
	pthread_t t;
	struct s3_client *c;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct lf *f = w->f;
	uint8_t *buf = malloc(DIGEST_CHUNK);
	char err[512];
	int fails = 0;
	for (;;) {
		size_t i = 0;
		uint64_t k = 0;
		pthread_mutex_lock(&f->mu);
		while (!f->stop && now_ms() - f->last_demand < LAZY_DEMAND_QUIET_MS) {
			pthread_mutex_unlock(&f->mu);
			struct timespec q = {0, 50000000L};
			nanosleep(&q, NULL);
			pthread_mutex_lock(&f->mu);
		}
		while (!f->stop && !f->fatal && f->missing && !next_missing(f, &i, &k))
			pthread_cond_wait(&f->cv,
					  &f->mu); /* every missing chunk is busy elsewhere */
		bool leave = f->stop || f->fatal || !f->missing || !buf;
		if (!leave)
			f->files[i].state[k] = CH_BUSY;
		pthread_mutex_unlock(&f->mu);
		if (leave)
			break;
		int r = fetch(f, w->c, i, k, buf, err, sizeof(err));
		if (r == -EILSEQ) {
			log_err(f->o->log, "lazy fetch: %s: the copy cannot become whole", err);
		} else if (r) {
			log_warn(f->o->log, "lazy fetch: %s (tried again)", err);
			/* The store is away: do not spin on it (the client already backed off). */
			struct timespec ts = {fails < 5 ? 0 : 1, fails < 5 ? 200000000L : 0};
			fails++;
			nanosleep(&ts, NULL);
		} else {
			fails = 0;
		}
	}
	free(buf);
	return NULL;
}

/* One request of the VMM: the reply's status. */
static int demand(struct lf *f, struct s3_client *c, const struct lazy_gate_req *q, uint8_t *buf)
{
	char name[CHAIN_NAME_MAX + 1];
	memcpy(name, q->name, CHAIN_NAME_MAX);
	name[CHAIN_NAME_MAX] = 0;
	size_t i = 0;
	while (i < f->rec->n && strcmp(f->rec->f[i].name, name))
		i++;
	if (i == f->rec->n) /* not arriving: a file that is whole here */
		return q->off % DIGEST_CHUNK ? -EINVAL : 0;
	struct lf_file *lf = &f->files[i];
	if (q->off % DIGEST_CHUNK || q->off / DIGEST_CHUNK >= lf->b.nchunks)
		return -EINVAL;
	uint64_t k = q->off / DIGEST_CHUNK;
	int64_t deadline = now_ms() + 1000LL * f->o->timeout_s;
	f->st->demand++;
	char err[512] = "";
	int last = 0;
	bool waited = false;
	for (;;) {
		pthread_mutex_lock(&f->mu);
		if (lf->state[k] != CH_HERE && (q->flags & LAZY_GATE_WAIT))
			f->last_demand = now_ms(); /* the guest waits: the background gives way */
		while (lf->state[k] == CH_BUSY) {
			waited = true;
			pthread_cond_wait(&f->cv, &f->mu);
		}
		int s = lf->state[k];
		bool mine = s == CH_MISSING && (q->flags & LAZY_GATE_WAIT);
		if (mine)
			lf->state[k] = CH_BUSY;
		pthread_mutex_unlock(&f->mu);
		if (s == CH_HERE) {
			f->st->demand_waits += waited;
			return 0;
		}
		if (!(q->flags & LAZY_GATE_WAIT))
			return -EAGAIN;
		waited = true;
		last = fetch(f, c, i, k, buf, err, sizeof(err));
		if (!last)
			continue;
		if (last == -EILSEQ) {
			log_err(f->o->log, "lazy fetch: %s", err);
			return -EILSEQ;
		}
		if (now_ms() >= deadline) {
			log_err(
			    f->o->log,
			    "lazy fetch: %s: chunk %llu: the store has not delivered it for %d s: "
			    "the VM stops (%s)",
			    name, (unsigned long long)k, f->o->timeout_s, err);
			return -ETIMEDOUT;
		}
		log_warn(f->o->log, "lazy fetch: %s (the guest waits; tried again)", err);
		struct timespec ts = {0, 250000000L};
		nanosleep(&ts, NULL);
	}
}

/* Serves the VMM until it closes the socket (or the copy broke). */
static void serve(struct lf *f, struct s3_client *c)
{
	uint8_t *buf = malloc(DIGEST_CHUNK);
	for (;;) {
		struct lazy_gate_req q;
		ssize_t n = read(f->o->sock, &q, sizeof(q));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break; /* the VMM is gone */
		struct lazy_gate_rep p = {.status = -EINVAL, .off = q.off};
		if (n == (ssize_t)sizeof(q) && buf)
			p.status = demand(f, c, &q, buf);
		if (write(f->o->sock, &p, sizeof(p)) != (ssize_t)sizeof(p))
			break;
	}
	free(buf);
}

/* Which chunks are here already (a fetcher before this one, or the pull's header chunks). */
static int scan(struct lf *f)
{
	uint8_t *buf = malloc(DIGEST_CHUNK);
	if (!buf)
		return -ENOMEM;
	for (size_t i = 0; i < f->rec->n; i++) {
		struct lf_file *lf = &f->files[i];
		for (uint64_t k = 0; k < lf->b.nchunks; k++) {
			f->st->chunks++;
			if (lazy_blob_chunk_present(&lf->b, k, lf->fd, buf)) {
				lf->state[k] = CH_HERE;
				f->st->present_at_start++;
			} else {
				f->missing++;
			}
		}
	}
	free(buf);
	return 0;
}

static int open_files(struct lf *f, struct s3_client *c, char *err, size_t errlen)
{
	int cdfd =
	    openat(f->o->sbx_dfd, SBX_CHAIN, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (cdfd < 0)
		return errmsg(err, errlen, -errno, "chain: %s", strerror(errno));
	int r = 0;
	for (size_t i = 0; !r && i < f->rec->n; i++) {
		const struct sbx_lazy_file *e = &f->rec->f[i];
		struct lf_file *lf = &f->files[i];
		lf->fd = openat(cdfd, e->name, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
		struct stat sb;
		if (lf->fd < 0 || fstat(lf->fd, &sb) < 0 || !S_ISREG(sb.st_mode) ||
		    (uint64_t)sb.st_size != e->size) {
			r = errmsg(err, errlen, -EINVAL,
				   "%s: missing, not a regular file, or not %llu "
				   "bytes",
				   e->name, (unsigned long long)e->size);
			break;
		}
		r = lazy_blob_open(c, e->name, e->digest, e->size, &lf->b, err, errlen);
		if (r == -ENOENT)
			r = errmsg(err, errlen, r, "%s: the store has no chunk list for it",
				   e->name);
		lf->state = r ? NULL : calloc(lf->b.nchunks ? lf->b.nchunks : 1, 1);
		if (!r && !lf->state)
			r = -ENOMEM;
	}
	close(cdfd);
	return r;
}

/* Every chunk here: synced, then the record goes. */
static int finish(struct lf *f, char *err, size_t errlen)
{
	for (size_t i = 0; i < f->rec->n; i++)
		if (fsync(f->files[i].fd) < 0)
			return errmsg(err, errlen, -errno, "%s: %s", f->rec->f[i].name,
				      strerror(errno));
	if (unlinkat(f->o->sbx_dfd, SBX_LAZY_FILE, 0) < 0 && errno != ENOENT)
		return errmsg(err, errlen, -errno, SBX_LAZY_FILE ": %s", strerror(errno));
	return fsync(f->o->sbx_dfd) < 0 ? -errno : 0;
}

/* Background only (no VMM, or after it left): until whole, or a fatal failure. */
static void wait_whole(struct lf *f)
{
	pthread_mutex_lock(&f->mu);
	while (f->missing && !f->fatal) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&f->cv, &f->mu, &ts);
		pthread_mutex_unlock(&f->mu);
		flush_stats(f);
		pthread_mutex_lock(&f->mu);
	}
	pthread_mutex_unlock(&f->mu);
}

/* Answers the VMM while the workers fetch; the stats flushed now and then. */
static void *server_main(void *arg)
{
	struct worker *w = arg;
	serve(w->f, w->c);
	return NULL;
}

int store_lazy_fetch(const struct lazy_fetch_opts *o, struct lazy_fetch_stats *st, char *err,
		     size_t errlen)
{
	memset(st, 0, sizeof(*st));
	st->whole_ms = -1;
	int64_t t0 = now_ms();
	int lk = sbx_lock_take(o->sbx_dfd, SBX_LAZY_LOCK, true, false);
	if (lk < 0)
		return errmsg(err, errlen, lk, SBX_LAZY_LOCK ": %s", strerror(-lk));
	struct lazy_fetch_opts oo = *o;
	if (!oo.timeout_s)
		oo.timeout_s = LAZY_FETCH_TIMEOUT_S;
	if (!oo.workers)
		oo.workers = LAZY_FETCH_WORKERS;
	struct lf f = {.o = &oo, .st = st, .last_demand = now_ms()};
	pthread_mutex_init(&f.mu, NULL);
	pthread_cond_init(&f.cv, NULL);
	struct worker *w = calloc((size_t)oo.workers + 1, sizeof(*w));
	f.rec = calloc(1, sizeof(*f.rec));
	int r = w && f.rec ? 0 : -ENOMEM, nw = 0;
	if (!r) {
		r = sbx_lazy_load(o->sbx_dfd, f.rec, err, errlen);
		if (r == -ENOENT)
			f.rec->n = 0, r = 0; /* whole already: only answer the VMM */
	}
	for (int i = 0; !r && i <= oo.workers; i++) {
		w[i].f = &f;
		struct s3_opts so = {.log = oo.log};
		r = s3_client_new(oo.cfg, &so, &w[i].c, err, errlen);
	}
	f.files = r ? NULL : calloc(f.rec->n ? f.rec->n : 1, sizeof(*f.files));
	if (!r && !f.files)
		r = -ENOMEM;
	for (size_t i = 0; f.files && i < f.rec->n; i++)
		f.files[i].fd = -1;
	if (!r)
		r = open_files(&f, w[oo.workers].c, err, errlen);
	if (!r)
		r = scan(&f);
	if (!r && f.rec->n)
		log_info(oo.log, "lazy fetch: %llu of %llu chunks to fetch",
			 (unsigned long long)f.missing, (unsigned long long)st->chunks);
	for (int i = 0; !r && f.missing && i < oo.workers; i++, nw++)
		if (pthread_create(&w[i].t, NULL, worker_main, &w[i]))
			break;
	pthread_t server;
	bool serving =
	    !r && oo.sock >= 0 && !pthread_create(&server, NULL, server_main, &w[oo.workers]);
	if (!r) {
		wait_whole(&f);
		if (f.fatal)
			r = errmsg(err, errlen, f.fatal, "%s", f.fatal_msg);
		else if (f.rec->n)
			r = finish(&f, err, errlen);
		if (!r) {
			st->whole_ms = now_ms() - t0;
			if (f.rec->n)
				log_info(oo.log,
					 "lazy fetch: whole after %lld ms (%llu chunks, %llu "
					 "bytes fetched)",
					 (long long)st->whole_ms,
					 (unsigned long long)st->fetched_chunks,
					 (unsigned long long)st->fetched_bytes);
		}
	}
	pthread_mutex_lock(&f.mu);
	f.stop = true;
	pthread_cond_broadcast(&f.cv);
	pthread_mutex_unlock(&f.mu);
	for (int i = 0; i < nw; i++)
		pthread_join(w[i].t, NULL);
	if (serving) /* the VMM's requests are answered until it leaves */
		pthread_join(server, NULL);
	flush_stats(&f);
	for (size_t i = 0; f.files && i < f.rec->n; i++) {
		if (f.files[i].fd >= 0)
			close(f.files[i].fd);
		lazy_blob_close(&f.files[i].b);
		free(f.files[i].state);
	}
	for (int i = 0; w && i <= oo.workers; i++)
		s3_client_free(w[i].c);
	free(f.files);
	free(f.rec);
	free(w);
	pthread_mutex_destroy(&f.mu);
	pthread_cond_destroy(&f.cv);
	close(lk);
	return r;
}
