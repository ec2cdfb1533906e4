/* Lazy restore of encrypted layers (and of plain ones still arriving from the store): a
 * userfaultfd thread fills pages the first time anything touches them, a run of neighbours with
 * each fault (snapshot/lazy_window.h). */
#ifndef COVE_LAZY_MEM_H
#define COVE_LAZY_MEM_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "snapshot/layer_restore.h"
#include "snapshot/lazy_window.h"
#include "snapshot/snap_crypt.h"

struct vm;

struct lazy_mem {
	struct vm *vm;
	struct layer_set *ls;	/* owned once started */
	struct crypto_ctx *cc;	/* the thread's own AES-GCM context; NULL: plain layers */
	struct lazy_gate *gate; /* owned; NULL: every layer file is whole */
	uint8_t chain_id[16];
	int uffd, stop_efd;
	pthread_t thread;
	bool started;
	uint8_t *plain;	  /* LAZY_WIN_MAX pages: a run, opened in place */
	uint8_t *tags;	  /* LAZY_WIN_MAX tags */
	int *res;	  /* LAZY_WIN_MAX results */
	uint64_t *filled; /* bit p: RAM page p was filled by this thread */
	uint64_t nr_pages;
	struct lazy_ra ra;
	bool prefetch;	   /* fill the rest while no fault waits (COVE_LAZY_PREFETCH=0: off) */
	bool prefetch_now; /* from the start, not from the first fault (COVE_LAZY_PREFETCH=1) */
	uint64_t prefetch_next; /* where the prefetch goes on */
	bool prefetch_blocked;	/* the next prefetch run is not fetched yet: look again soon */
	uint64_t faults, zero_pages, bad_pages, pages_filled, pages_prefetched;
	struct lazy_ahead *ahead; /* decrypting ahead on a helper thread (freed by stop) */
	bool ahead_started;	  /* a helper was started */
	bool ahead_done;	  /* and every run it opened was copied */
};

/*
 * Registers all of the VM's RAM (a fresh, empty memfd) with userfaultfd and starts the thread
 * that serves missing pages from the newest layer holding them: decrypted and authenticated
 * (AES-GCM tag) before UFFDIO_COPY, or zero. A fault fills a run of not yet filled pages with
 * data around it in one UFFDIO_COPY (lazy_window_pick: a small aligned window, growing while
 * faults are sequential); a neighbour that fails authentication is left out of the run. While
 * no fault waits, the thread fills the pages with data that nothing touched yet, in the same
 * runs, lowest first (prefetch, from the first fault on and with more than one CPU;
 * COVE_LAZY_PREFETCH=1: from the start, =0: never; COVE_LAZY_WINDOW=N caps a run at N pages), so
 * the guest soon stops faulting; a page that fails authentication is left for its own fault (which
 * stops the VM). An encrypted chain without a gate is opened ahead instead, from the start, by a
 * helper thread (snapshot/lazy_ahead.h; COVE_LAZY_AHEAD=0: not), and this thread copies the runs
 * it opened (from the first fault on, like the prefetch), skipping the pages faults filled
 * meanwhile.  A page that fails authentication is never given to the guest: the VM is stopped
 * with a message naming layer and page.  Takes ownership of `ls`. 0 or -errno with a message in
 * `err`.
 *
 * sc NULL: plain layers, copied as read. gate (owned from here on, also on failure): layer files
 * still arriving from the store; every range is read only once the fetcher has it, a fault
 * waits for it, the prefetch takes only what is there (and looks again every 20 ms), and a
 * range the fetcher cannot deliver stops the VM with one line (the guest never sees a page of
 * a chunk that was not checked).
 */
int lazy_mem_start(struct lazy_mem *lm, struct vm *vm, struct layer_set *ls,
		   const struct snap_crypt *sc, struct lazy_gate *gate, char *err, size_t errlen);
void lazy_mem_stop(struct lazy_mem *lm);
/*
 * Eager check (restore --verify): authenticates every stored page of every layer before the
 * guest runs.  0, or -EBADMSG naming the first bad page in `err`.
 */
int lazy_mem_verify_all(const struct layer_set *ls, const struct snap_crypt *sc, char *err,
			size_t errlen);

#endif
