/* Lazy restore of encrypted layers, in runs: which pages to fill for one fault, and opening a run
 * of pages (batched reads, one AES-GCM open per page) for one UFFDIO_COPY. */
#ifndef COVE_LAZY_WINDOW_H
#define COVE_LAZY_WINDOW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "snapshot/crypto.h"
#include "snapshot/layer_restore.h"
#include "snapshot/lazy_gate.h"

/* A fault off the sequential path fills at most the aligned block of this many pages around it. */
#define LAZY_WIN_MIN 16u
/* Faults that follow the previous run double the window up to this (2 MiB). */
#define LAZY_WIN_MAX 512u

/* Readahead state of one handler: where the previous run ended and its window. */
struct lazy_ra {
	uint64_t next; /* the page after the previous run */
	uint32_t win;  /* 0 before the first fault */
	uint32_t max;  /* the largest window (1: page by page); 0: LAZY_WIN_MAX */
};

/* The newest layer of `ls` that holds page p (NULL: none, a zero page). */
const struct mem_layer *lazy_source(const struct layer_set *ls, uint64_t p);
/* Page p holds data (its newest layer stored it): a run may take it. */
bool lazy_page_stored(const struct layer_set *ls, uint64_t p);

/*
 * The run [*first, *first + *count) to fill for a fault at page p of `nr_pages` (p < nr_pages):
 * always p (alone when p holds no data: a zero page); around it only pages not yet `filled` (bit
 * set) that hold data, within the window (the aligned block of ra->win pages around p, or [p, p +
 * win) when p follows the previous run, the window then doubling up to LAZY_WIN_MAX), never past
 * nr_pages. Updates `ra`.
 */
void lazy_window_pick(const uint64_t *filled, uint64_t nr_pages, const struct layer_set *ls,
		      uint64_t p, struct lazy_ra *ra, uint64_t *first, uint64_t *count);

/*
 * Prefetch: the first run at or after page `from` of pages not yet `filled` (NULL: none is) that
 * hold data, at most `max` pages, never past nr_pages. False when there is none.
 */
bool lazy_next_run(const uint64_t *filled, uint64_t nr_pages, const struct layer_set *ls,
		   uint64_t from, uint64_t max, uint64_t *first, uint64_t *count);

/*
 * Opens pages [first, first + count) (count <= LAZY_WIN_MAX) into `plain` (count pages): each
 * from its newest layer, runs of pages stored in one layer read with one pread for their data
 * and (encrypted, cc set) one for their tags, each page authenticated on its own
 * (crypto_open_page); a plain layer's pages are copied as read (cc NULL: a plain chain whose
 * layers still arrive from the store). A page no layer stores is zeros. With a gate, each
 * range is read only once the fetcher says it is present (`wait` false: -EAGAIN for the pages
 * of a range that is not yet). res[i] gets page first + i's result: 0, -EBADMSG (altered data
 * or tag; the page is zeroed), -EIO (short read), the gate's -errno, or another -errno from
 * crypto_open_page. `tags` holds count * CRYPTO_TAG_LEN bytes.
 */
struct lazy_src {
	struct crypto_ctx *cc; /* NULL: plain layers */
	const uint8_t *chain_id;
	const struct layer_set *ls;
	struct lazy_gate *gate; /* NULL: every layer file is whole */
	bool wait;
};
void lazy_open_run(const struct lazy_src *src, uint64_t first, uint64_t count, uint8_t *plain,
		   uint8_t *tags, int *res);

#endif
