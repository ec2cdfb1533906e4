/* Sealing a memory layer's staged pages: AES-256-GCM in place, on several threads, with the tags
 * gathered in whole 4 KiB blocks of the tag region so the layer can be written with O_DIRECT. */
#include "snapshot/layer_seal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PAGE  4096ULL
#define BLOCK 4096ULL

void seal_tags_free(struct seal_tags *t)
{
	free(t->buf);
	free(t->ext);
	memset(t, 0, sizeof(*t));
}

unsigned layer_seal_threads(uint64_t pages)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	uint64_t by_work = pages / SEAL_PAGES_PER_THREAD_MIN;
	uint64_t t = cpus > 0 ? (uint64_t)cpus : 1;
	if (t > by_work)
		t = by_work;
	if (t > SEAL_THREADS_MAX)
		t = SEAL_THREADS_MAX;
	return t ? (unsigned)t : 1;
}

/* Per extent: its first page's index among all pages and its first tag block's slot. */
struct plan {
	uint64_t *page0; /* n + 1 entries: page0[n] = all pages */
	uint64_t *slot0;
	uint64_t total;
};

static uint64_t layer_page(const struct seal_job *j, size_t e, uint64_t k)
{
	return (j->ext[e].file_off - j->data_off) / PAGE + k;
}

/* Slots for the tag blocks, extents for the tag writes (consecutive blocks merged). */
static int plan_tags(const struct seal_job *j, struct plan *pl, struct seal_tags *t)
{
	size_t cap = 16;
	uint64_t slots = 0, last_block = UINT64_MAX;
	pl->page0 = calloc(j->n + 1, sizeof(uint64_t));
	pl->slot0 = calloc(j->n + 1, sizeof(uint64_t));
	t->ext = malloc(cap * sizeof(*t->ext));
	if (!pl->page0 || !pl->slot0 || !t->ext)
		return -ENOMEM;
	for (size_t e = 0; e < j->n; e++) {
		if (j->ext[e].file_off < j->data_off || (j->ext[e].file_off - j->data_off) % PAGE ||
		    j->ext[e].len % PAGE || j->ext[e].buf_off % PAGE)
			return -EINVAL;
		uint64_t pages = j->ext[e].len / PAGE;
		pl->page0[e + 1] = pl->page0[e] + pages;
		if (!pages) {
			pl->slot0[e] = slots;
			continue;
		}
		uint64_t b0 = layer_page(j, e, 0) / SEAL_TAGS_PER_BLOCK;
		uint64_t b1 = layer_page(j, e, pages - 1) / SEAL_TAGS_PER_BLOCK;
		if (last_block != UINT64_MAX && b0 < last_block)
			return -EINVAL; /* extents go up the file */
		/* The first block may be the previous extent's last one. */
		pl->slot0[e] = b0 == last_block ? slots - 1 : slots;
		for (uint64_t b = b0 == last_block ? b0 + 1 : b0; b <= b1; b++) {
			uint64_t off = j->tag_off + b * BLOCK;
			if (t->n && t->ext[t->n - 1].file_off + t->ext[t->n - 1].len == off) {
				t->ext[t->n - 1].len += BLOCK;
			} else {
				if (t->n == cap) {
					cap *= 2;
					struct write_extent *ne =
					    realloc(t->ext, cap * sizeof(*ne));
					if (!ne)
						return -ENOMEM;
					t->ext = ne;
				}
				t->ext[t->n++] = (struct write_extent){off, slots * BLOCK, BLOCK};
			}
			slots++;
		}
		last_block = b1;
	}
	pl->total = pl->page0[j->n];
	t->len = (size_t)(slots * BLOCK);
	if (t->len) {
		t->buf = aligned_alloc(BLOCK, t->len);
		if (!t->buf)
			return -ENOMEM;
		memset(t->buf, 0, t->len);
	}
	return 0;
}

struct worker {
	const struct seal_job *j;
	const struct plan *pl;
	struct seal_tags *t;
	struct crypto_ctx *cc;
	uint64_t g0, g1; /* pages [g0, g1) of all */
	int r;
	pthread_t th;
};

static void *seal_range(void *arg)
{
	struct worker *w = arg;
	const struct seal_job *j = w->j;
	/* The extent holding page g0 (page0 is sorted). */
	size_t lo = 0, hi = j->n;
	while (hi - lo > 1) {
		size_t mid = (lo + hi) / 2;
		if (w->pl->page0[mid] <= w->g0)
			lo = mid;
		else
			hi = mid;
	}
	w->r = 0;
	for (size_t e = lo; e < j->n && w->pl->page0[e] < w->g1 && !w->r; e++) {
		uint64_t pages = j->ext[e].len / PAGE;
		uint64_t k0 = w->g0 > w->pl->page0[e] ? w->g0 - w->pl->page0[e] : 0;
		uint64_t k1 = w->g1 - w->pl->page0[e] < pages ? w->g1 - w->pl->page0[e] : pages;
		uint64_t b0 = layer_page(j, e, 0) / SEAL_TAGS_PER_BLOCK;
		for (uint64_t k = k0; k < k1 && !w->r; k++) {
			uint64_t p = layer_page(j, e, k);
			uint64_t slot = w->pl->slot0[e] + p / SEAL_TAGS_PER_BLOCK - b0;
			uint8_t *tag = w->t->buf + slot * BLOCK + (p % SEAL_TAGS_PER_BLOCK) * 16;
			uint8_t *pg = j->buf + j->ext[e].buf_off + k * PAGE;
			w->r =
			    crypto_seal_page(w->cc, j->chain_id, j->layer_id, p, pg, PAGE, pg, tag);
		}
	}
	return NULL;
}

static int by_file_off(const void *a, const void *b)
{
	const struct write_extent *x = a, *y = b;
	return x->file_off < y->file_off ? -1 : x->file_off > y->file_off;
}

/*
 * The job's extents going up the file: as given, or a sorted copy in *copy (freed by the
 * caller). A snapshot's pause appends the pages written since its pre-copy after the
 * pre-copy's sorted extents, at any place in the file. Two extents sharing a page: -EINVAL.
 */
static int ascending(const struct seal_job *j, struct write_extent **copy)
{
	const struct write_extent *e = j->ext;
	size_t i = 1;
	*copy = NULL;
	while (i < j->n && e[i].file_off >= e[i - 1].file_off)
		i++;
	if (i < j->n) {
		*copy = malloc(j->n * sizeof(**copy));
		if (!*copy)
			return -ENOMEM;
		memcpy(*copy, e, j->n * sizeof(**copy));
		qsort(*copy, j->n, sizeof(**copy), by_file_off);
		e = *copy;
	}
	for (i = 1; i < j->n; i++)
		if (e[i].file_off < e[i - 1].file_off + e[i - 1].len)
			return -EINVAL;
	return 0;
}

int layer_seal_ctx(const struct seal_job *j, struct crypto_ctx **cc)
{
	*cc = NULL;
	int r = crypto_ctx_new(j->key, cc);
	if (!r && (r = crypto_ctx_add_layer(*cc, j->layer_id, j->salt))) {
		crypto_ctx_free(*cc);
		*cc = NULL;
	}
	return r;
}

/* A job being sealed batch by batch (layer_seal_begin). */
struct seal_plan {
	struct seal_job j; /* its extents ascending: the caller's or copy */
	struct write_extent *copy;
	struct plan pl;
	struct seal_tags *t;
};

/* The extents again, none longer than max (page multiples): a new array in *out. */
static int split_long(const struct write_extent *e, size_t n, uint64_t max,
		      struct write_extent **out, size_t *nout)
{
	size_t k = 0, cap = n;
	for (size_t i = 0; i < n; i++)
		cap += e[i].len / max;
	*out = malloc((cap ? cap : 1) * sizeof(**out));
	if (!*out)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		for (uint64_t off = 0; off < e[i].len || (!off && !e[i].len); off += max) {
			uint64_t len = e[i].len - off < max ? e[i].len - off : max;
			(*out)[k++] =
			    (struct write_extent){e[i].file_off + off, e[i].buf_off + off, len};
			if (!len)
				break;
		}
	*nout = k;
	return 0;
}

int layer_seal_begin(const struct seal_job *job, uint64_t max_len, struct seal_tags *t,
		     struct seal_plan **out, const struct write_extent **ext, size_t *n)
{
	struct seal_plan *sp = calloc(1, sizeof(*sp));
	struct write_extent *sorted = NULL;
	memset(t, 0, sizeof(*t));
	*out = NULL;
	if (!sp)
		return -ENOMEM;
	sp->j = *job;
	sp->t = t;
	max_len -= max_len % PAGE;
	int r = max_len ? ascending(job, &sorted) : -EINVAL;
	if (!r)
		r = split_long(sorted ? sorted : job->ext, job->n, max_len, &sp->copy, &sp->j.n);
	free(sorted);
	if (sp->copy)
		sp->j.ext = sp->copy;
	if (!r)
		r = plan_tags(&sp->j, &sp->pl, t);
	if (r) {
		layer_seal_end(sp);
		seal_tags_free(t);
		return r;
	}
	*ext = sp->j.ext;
	*n = sp->j.n;
	*out = sp;
	return 0;
}

int layer_seal_extents(struct seal_plan *sp, struct crypto_ctx *cc, size_t e0, size_t e1)
{
	if (e0 > e1 || e1 > sp->j.n)
		return -EINVAL;
	struct worker w = {.j = &sp->j,
			   .pl = &sp->pl,
			   .t = sp->t,
			   .cc = cc ? cc : sp->j.cc,
			   .g0 = sp->pl.page0[e0],
			   .g1 = sp->pl.page0[e1]};
	if (w.g0 < w.g1)
		seal_range(&w);
	return w.r;
}

void layer_seal_end(struct seal_plan *sp)
{
	if (!sp)
		return;
	free(sp->copy);
	free(sp->pl.page0);
	free(sp->pl.slot0);
	free(sp);
}

int layer_seal(const struct seal_job *job, unsigned threads, struct seal_tags *t)
{
	struct plan pl = {0};
	struct seal_job sorted = *job, *j = &sorted;
	struct write_extent *copy;
	memset(t, 0, sizeof(*t));
	int r = ascending(job, &copy);
	if (copy)
		sorted.ext = copy;
	if (!r)
		r = plan_tags(j, &pl, t);
	if (r || !pl.total)
		goto out;
	if (threads < 1)
		threads = 1;
	if (threads > SEAL_THREADS_MAX)
		threads = SEAL_THREADS_MAX;
	if (threads > pl.total)
		threads = (unsigned)pl.total;
	struct worker w[SEAL_THREADS_MAX];
	memset(w, 0, sizeof(w));
	unsigned started = 0;
	for (unsigned i = 0; i < threads; i++) {
		w[i] = (struct worker){.j = j,
				       .pl = &pl,
				       .t = t,
				       .cc = j->cc,
				       .g0 = pl.total * i / threads,
				       .g1 = pl.total * (i + 1) / threads};
		if (i == 0)
			continue;
		int e = layer_seal_ctx(j, &w[i].cc);
		if (!e)
			e = -pthread_create(&w[i].th, NULL, seal_range, &w[i]);
		if (e) {
			if (w[i].cc)
				crypto_ctx_free(w[i].cc);
			w[i].cc = NULL;
			/* No thread for this share: the calling thread seals it after its own. */
			w[i].r = 1;
			continue;
		}
		started |= 1u << i;
	}
	seal_range(&w[0]);
	r = w[0].r;
	for (unsigned i = 1; i < threads; i++) {
		if (started & (1u << i)) {
			pthread_join(w[i].th, NULL);
			crypto_ctx_free(w[i].cc);
			if (!r)
				r = w[i].r;
		} else if (!r) { /* no thread for this share: the caller seals it */
			w[i].cc = j->cc;
			seal_range(&w[i]);
			r = w[i].r;
		}
	}
out:
	free(copy);
	free(pl.page0);
	free(pl.slot0);
	if (r)
		seal_tags_free(t);
	return r;
}
