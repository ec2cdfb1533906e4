/* The cache rules: usage, what may be evicted, least recently used first (cache.h). */
#include "lifecycle/cache.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/size_parse.h"

int cache_max_parse(const char *s, uint64_t *out)
{
	uint64_t v;
	int r = size_parse(s, &v);

	if (r)
		return r;
	if (v < CACHE_MAX_MIN || v > CACHE_MAX_MAX)
		return -ERANGE;
	*out = v;
	return 0;
}

static int by_inode(const void *a, const void *b)
{
	const struct cache_file *x = a, *y = b;

	if (x->dev != y->dev)
		return x->dev < y->dev ? -1 : 1;
	if (x->ino != y->ino)
		return x->ino < y->ino ? -1 : 1;
	return 0;
}

void cache_account(struct cache_file *f, size_t n, size_t nr_owners, uint64_t *usage,
		   uint64_t *freeable)
{
	*usage = 0;
	if (nr_owners) /* none: freeable may be NULL (an empty state root) */
		memset(freeable, 0, nr_owners * sizeof(*freeable));
	if (n)
		qsort(f, n, sizeof(*f), by_inode);
	for (size_t i = 0; i < n;) {
		size_t j = i + 1;
		bool one_owner = f[i].owner >= 0;

		for (; j < n && !by_inode(&f[i], &f[j]); j++)
			one_owner = one_owner && f[j].owner == f[i].owner;
		*usage += f[i].bytes;
		/* Every name of it under one sandbox: removing that directory frees it. */
		if (one_owner && (size_t)f[i].owner < nr_owners && j - i >= f[i].nlink)
			freeable[f[i].owner] += f[i].bytes;
		i = j;
	}
}

const char *cache_keep_reason(const struct cache_cand *c)
{
	switch (c->state) {
	case SBX_RUNNING:
		return "running";
	case SBX_PAUSED:
		return "paused";
	case SBX_STOPPED:
	case SBX_CRASHED:
		break;
	case SBX_ARCHIVED:
		return "archived (its packed chain is not checked against the store)";
	default:
		return sbx_state_name(c->state);
	}
	if (c->busy)
		return "in use (a start, stop, fork or upload holds it)";
	if (c->audit)
		return "its broker audit log is kept only on this host";
	if (!c->committed)
		return "its newest state is not committed in the store";
	if (!c->bytes)
		return "it shares every file it has: evicting it frees nothing";
	return NULL;
}

/* qsort has no argument: the candidates travel beside each index. */
struct ranked {
	const struct cache_cand *c;
	size_t i;
};

static int by_use(const void *a, const void *b)
{
	const struct ranked *x = a, *y = b;

	if (x->c->last_used_ms != y->c->last_used_ms)
		return x->c->last_used_ms < y->c->last_used_ms ? -1 : 1;
	return strcmp(x->c->name, y->c->name);
}

size_t cache_plan(const struct cache_cand *c, size_t n, uint64_t usage, uint64_t max, size_t *order,
		  uint64_t *after)
{
	struct ranked *r = n ? calloc(n, sizeof(*r)) : NULL;
	size_t m = 0, k = 0;

	*after = usage;
	if (!r)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!cache_keep_reason(&c[i]))
			r[m++] = (struct ranked){&c[i], i};
	qsort(r, m, sizeof(*r), by_use);
	for (size_t i = 0; i<m && * after> max; i++) {
		order[k++] = r[i].i;
		*after -= r[i].c->bytes < *after ? r[i].c->bytes : *after;
	}
	free(r);
	return k;
}
