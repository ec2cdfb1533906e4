/*
 * The fetcher of memory layers still arriving from the store (issue 29): `cove-store lazy NAME`,
 * a host process outside the jail, started beside the VMM that restores NAME. It holds
 * NAME/store-lazy.lock while it runs (one fetcher per sandbox; a second waits for the first).
 *
 * - Answers the VMM's requests (snapshot/lazy_gate.h) on `sock`: a chunk that is here and checked
 *   at once; a missing one is fetched now, ahead of the background order, and answered when it
 *   is written and checked, or with -ETIMEDOUT once the store failed for `timeout_s` (the VMM then
 *   stops with one line; the next start fetches again), or -EILSEQ for data that does not match.
 * - Meanwhile `workers` threads fetch every other missing chunk, lowest offset first.
 * - A chunk already in the file and matching its SHA-256 (an earlier fetcher's work) is not
 *   fetched again.
 * - When every chunk of every recorded file is here: files synced, then NAME/store-lazy.json
 *   removed (the copy is whole: mapped, uploaded, archived and forked like any other). Then it
 *   answers the VMM (everything present) until the VMM closes the socket, and returns.
 * - If the VMM goes first, the fetch goes on until the copy is whole.
 */
#ifndef COVE_LIFECYCLE_STORE_LAZY_FETCH_H
#define COVE_LIFECYCLE_STORE_LAZY_FETCH_H

#include <stddef.h>
#include <stdint.h>

struct store_config;
struct logger;

#define LAZY_FETCH_TIMEOUT_S 60 /* a chunk the store does not deliver for this long fails */
#define LAZY_FETCH_WORKERS   3

struct lazy_fetch_opts {
	const struct store_config *cfg;
	int sbx_dfd; /* the sandbox's directory */
	int sock;    /* the VMM's socket (SOCK_SEQPACKET), or -1 */
	struct logger *log;
	int timeout_s; /* 0: LAZY_FETCH_TIMEOUT_S */
	int workers;   /* 0: LAZY_FETCH_WORKERS */
};

struct lazy_fetch_stats {
	uint64_t chunks, present_at_start, fetched_chunks, fetched_bytes, demand, demand_waits;
	uint64_t failures;
	int64_t whole_ms; /* from the start to the copy being whole; -1 never */
};

/* 0 once the copy is whole (and the VMM, if any, has gone), or -errno with one line in err. */
int store_lazy_fetch(const struct lazy_fetch_opts *o, struct lazy_fetch_stats *st, char *err,
		     size_t errlen);

#endif
