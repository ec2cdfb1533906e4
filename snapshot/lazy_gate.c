/* The VMM's side of memory layers still arriving from the store (lazy_gate.h). */
#include "snapshot/lazy_gate.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

struct lazy_gate *lazy_gate_new(int fd, const struct chain *c, int nr, const uint64_t *sizes)
{
	struct lazy_gate *g = calloc(1, sizeof(*g));
	if (!g)
		return NULL;
	g->fd = fd;
	g->nr = nr;
	for (int i = 0; i < nr; i++) {
		snprintf(g->names[i], sizeof(g->names[i]), "%s", c->layers[i].mem);
		g->chunks[i] = (sizes[i] + LAZY_GATE_CHUNK - 1) / LAZY_GATE_CHUNK;
		g->known[i] = calloc((size_t)(g->chunks[i] / 64 + 1), sizeof(uint64_t));
		if (!g->known[i]) {
			lazy_gate_free(g);
			return NULL;
		}
	}
	return g;
}

void lazy_gate_free(struct lazy_gate *g)
{
	if (!g)
		return;
	for (int i = 0; i < g->nr; i++)
		free(g->known[i]);
	if (g->fd >= 0)
		close(g->fd);
	free(g);
}

/* One chunk: asks the fetcher unless it said so before. */
static int need_chunk(struct lazy_gate *g, int i, uint64_t c, bool wait)
{
	if ((g->known[i][c / 64] >> (c % 64)) & 1)
		return 0;
	struct lazy_gate_req q = {.off = c * LAZY_GATE_CHUNK, .flags = wait ? LAZY_GATE_WAIT : 0};
	memcpy(q.name, g->names[i], sizeof(q.name));
	uint64_t t0 = now_us();
	ssize_t n = write(g->fd, &q, sizeof(q));
	if (n != (ssize_t)sizeof(q))
		return n < 0 ? -errno : -EPIPE;
	struct lazy_gate_rep p;
	do
		n = read(g->fd, &p, sizeof(p));
	while (n < 0 && errno == EINTR);
	if (n != (ssize_t)sizeof(p))
		return n < 0 ? -errno : -EPIPE; /* the fetcher is gone: nothing more arrives */
	if (p.off != q.off)
		return -EPROTO;
	if (p.status)
		return p.status < 0 ? p.status : -EPROTO;
	g->known[i][c / 64] |= 1ULL << (c % 64);
	g->asked++;
	g->waited_us += now_us() - t0;
	return 0;
}

int lazy_gate_need(struct lazy_gate *g, int i, uint64_t off, uint64_t len, bool wait)
{
	if (i < 0 || i >= g->nr)
		return -EINVAL;
	if (!len)
		return 0;
	uint64_t first = off / LAZY_GATE_CHUNK, last = (off + len - 1) / LAZY_GATE_CHUNK;
	if (last >= g->chunks[i])
		return -ERANGE;
	for (uint64_t c = first; c <= last; c++) {
		int r = need_chunk(g, i, c, wait);
		if (r)
			return r;
	}
	return 0;
}

const char *lazy_gate_strerror(int r)
{
	switch (r) {
	case -ETIMEDOUT:
		return "the store did not answer within the fetch timeout";
	case -EILSEQ:
		return "a chunk fetched from the store failed its digest";
	case -EPIPE:
		return "the fetcher is gone";
	default:
		return strerror(-r);
	}
}
