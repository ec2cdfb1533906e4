/* Lazy restore of encrypted layers: a helper thread decrypts runs of the chain's pages ahead of
 * the guest, so that the userfaultfd thread mostly copies pages that are already open. */
#ifndef COVE_LAZY_AHEAD_H
#define COVE_LAZY_AHEAD_H

#include <stdbool.h>
#include <stdint.h>

#include "snapshot/crypto.h"
#include "snapshot/layer_restore.h"

struct vm;

/* Pages per run the helper opens (1 MiB), and runs it keeps open at once. */
#define AHEAD_RUN   256u
#define AHEAD_SLOTS 4u

/* One opened run: pages [first, first + good) are in plain; page first + good (when good <
 * count) failed and is left to its own fault. */
struct ahead_run {
	uint64_t first, count, good;
	uint8_t *plain;
};

struct lazy_ahead;

/*
 * Starts the helper: from page 0 up, it opens every run of pages the chain stores (at most
 * AHEAD_RUN pages each, each page authenticated as a fault's would be) into one of AHEAD_SLOTS
 * buffers, with a context of its own (a copy of cc, which holds the chain's layers), and signals
 * each opened run on lazy_ahead_fd. The pages it opens may be filled by faults meanwhile: the
 * consumer copies only what is still missing. The helper runs the VM's per-thread set-up for
 * the userfaultfd thread first (its seccomp filter). 0 or -errno.
 */
int lazy_ahead_start(struct lazy_ahead **out, struct vm *vm, const struct layer_set *ls,
		     const struct crypto_ctx *cc, const uint8_t chain_id[16], uint64_t nr_pages);
/* An eventfd readable while an opened run waits (and once the helper is done). */
int lazy_ahead_fd(const struct lazy_ahead *a);
/* The oldest opened run, or NULL when none is (yet); lazy_ahead_pop gives its buffer back. */
const struct ahead_run *lazy_ahead_peek(struct lazy_ahead *a);
void lazy_ahead_pop(struct lazy_ahead *a);
/* True once the helper has opened every run and each was popped. */
bool lazy_ahead_done(struct lazy_ahead *a);
/* Stops and joins the helper, frees everything (NULL: nothing). */
void lazy_ahead_stop(struct lazy_ahead *a);

#endif
