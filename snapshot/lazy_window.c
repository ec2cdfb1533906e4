/* Lazy restore (encrypted layers, or plain ones still arriving from the store), in runs: which
 * pages to fill for one fault, and opening a run of pages (batched reads, one AES-GCM open per
 * page) for one UFFDIO_COPY. */
#include "snapshot/lazy_window.h"

#include <errno.h>
#include <string.h>

#include "common/file_io.h"

const struct mem_layer *lazy_source(const struct layer_set *ls, uint64_t p)
{
	for (int i = ls->nr - 1; i >= 0; i--)
		if (mem_layer_has(&ls->layers[i], p))
			return &ls->layers[i];
	return NULL;
}

bool lazy_page_stored(const struct layer_set *ls, uint64_t p)
{
	const struct mem_layer *l = lazy_source(ls, p);
	return l && mem_layer_stored(l, p);
}

static bool is_filled(const uint64_t *filled, uint64_t p)
{
	return filled && (filled[p / 64] >> (p % 64)) & 1;
}

void lazy_window_pick(const uint64_t *filled, uint64_t nr_pages, const struct layer_set *ls,
		      uint64_t p, struct lazy_ra *ra, uint64_t *first, uint64_t *count)
{
	uint64_t lo, hi;		/* the window, [lo, hi) */
	if (!lazy_page_stored(ls, p)) { /* a zero page: only itself (no decryption to share) */
		*first = p;
		*count = 1;
		return;
	}
	uint32_t cap = ra->max && ra->max < LAZY_WIN_MAX ? ra->max : LAZY_WIN_MAX;
	if (ra->win && p == ra->next) {
		ra->win = ra->win * 2 > cap ? cap : ra->win * 2;
		lo = p;
	} else {
		ra->win = LAZY_WIN_MIN < cap ? LAZY_WIN_MIN : cap;
		lo = p - p % ra->win;
	}
	hi = nr_pages - lo < ra->win ? nr_pages : lo + ra->win;
	uint64_t a = p, b = p + 1;
	while (a > lo && !is_filled(filled, a - 1) && lazy_page_stored(ls, a - 1))
		a--;
	while (b < hi && !is_filled(filled, b) && lazy_page_stored(ls, b))
		b++;
	*first = a;
	*count = b - a;
	ra->next = b;
}

/* No layer holds a page of the 64 that word w of the bitmaps covers. */
static bool word_empty(const struct layer_set *ls, uint64_t w)
{
	for (int i = 0; i < ls->nr; i++) {
		const struct mem_layer *l = &ls->layers[i];
		if (w < (l->info.nr_pages + 63) / 64 && l->bitmap[w])
			return false;
	}
	return true;
}

bool lazy_next_run(const uint64_t *filled, uint64_t nr_pages, const struct layer_set *ls,
		   uint64_t from, uint64_t max, uint64_t *first, uint64_t *count)
{
	uint64_t q = from;
	while (q < nr_pages) {
		if (q % 64 == 0 &&
		    ((filled && filled[q / 64] == ~0ULL) || word_empty(ls, q / 64))) {
			q += 64;
			continue;
		}
		if (!is_filled(filled, q) && lazy_page_stored(ls, q))
			break;
		q++;
	}
	if (q >= nr_pages || !max)
		return false;
	uint64_t b = q + 1;
	while (b < nr_pages && b - q < max && !is_filled(filled, b) && lazy_page_stored(ls, b))
		b++;
	*first = q;
	*count = b - q;
	return true;
}

/* Before reading [off, off + len) of layer l: the gate's answer (0 without a gate). */
static int gate(const struct lazy_src *s, const struct mem_layer *l, uint64_t off, uint64_t len)
{
	if (!s->gate)
		return 0;
	return lazy_gate_need(s->gate, (int)(l - s->ls->layers), off, len, s->wait);
}

/* Pages [p, p + n) of layer l, all stored in it: one read of data, one of tags, n opens. */
static void open_span(const struct lazy_src *s, const struct mem_layer *l, uint64_t p, uint64_t n,
		      uint8_t *plain, uint8_t *tags, int *res)
{
	uint64_t data = l->info.data_off + p * MEM_LAYER_PAGE;
	uint64_t tag = l->info.tag_off + p * CRYPTO_TAG_LEN;
	int r = gate(s, l, data, n * MEM_LAYER_PAGE);
	if (!r && s->cc)
		r = gate(s, l, tag, n * CRYPTO_TAG_LEN);
	if (!r)
		r = pread_full(l->fd, plain, n * MEM_LAYER_PAGE, (off_t)data);
	if (!r && s->cc)
		r = pread_full(l->fd, tags, n * CRYPTO_TAG_LEN, (off_t)tag);
	for (uint64_t i = 0; i < n; i++) {
		uint8_t *pg = plain + i * MEM_LAYER_PAGE;
		if (r) {
			memset(pg, 0, MEM_LAYER_PAGE);
			res[i] = r == -EAGAIN || s->gate ? r : -EIO;
			continue;
		}
		res[i] = s->cc ? crypto_open_page(s->cc, s->chain_id, l->info.layer_id, p + i, pg,
						  MEM_LAYER_PAGE, pg, tags + i * CRYPTO_TAG_LEN)
			       : 0;
	}
}

void lazy_open_run(const struct lazy_src *src, uint64_t first, uint64_t count, uint8_t *plain,
		   uint8_t *tags, int *res)
{
	uint64_t i = 0;
	while (i < count) {
		const struct mem_layer *l = lazy_source(src->ls, first + i);
		if (!l || !mem_layer_stored(l, first + i)) {
			memset(plain + i * MEM_LAYER_PAGE, 0, MEM_LAYER_PAGE);
			res[i++] = 0;
			continue;
		}
		uint64_t n = 1;
		while (i + n < count && lazy_source(src->ls, first + i + n) == l &&
		       mem_layer_stored(l, first + i + n))
			n++;
		open_span(src, l, first + i, n, plain + i * MEM_LAYER_PAGE, tags, res + i);
		i += n;
	}
}
