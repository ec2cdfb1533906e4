/*
 * Memory layers that are still arriving from the object store (issue 29): before the VMM reads
 * a range of such a layer file, it asks the host's fetcher (`cove-store lazy`, outside the jail)
 * over a SOCK_SEQPACKET socket, one 1 MiB chunk at a time, and reads only once the fetcher says
 * the chunk is in the file and checked against its digest. A hole in a partly fetched file
 * reads as zeros, so nothing of such a file is ever mapped or read without this answer.
 *
 * The wire (both sides are this host's; the fetcher still checks every request, since the VMM
 * is untrusted once a guest may have broken in):
 *   request  struct lazy_gate_req: the layer file's name, the chunk's offset, flags
 *   reply    struct lazy_gate_rep: 0 (present), -EAGAIN (not yet, for a request without
 *            LAZY_GATE_WAIT), or -errno (the store failed past the fetcher's timeout, a chunk
 *            failed its digest, an unknown file): the VMM then stops with one line.
 */
#ifndef COVE_LAZY_GATE_H
#define COVE_LAZY_GATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "snapshot/chain.h"
#include "snapshot/digest.h"

#define LAZY_GATE_CHUNK DIGEST_CHUNK /* the fetcher's unit: the digest tree's leaves */
#define LAZY_GATE_WAIT	1u

struct lazy_gate_req {
	char name[CHAIN_NAME_MAX]; /* a memory layer file of the chain directory, NUL-terminated */
	uint64_t off;		   /* a multiple of LAZY_GATE_CHUNK */
	uint32_t flags;
	uint32_t pad;
};

struct lazy_gate_rep {
	int32_t status;
	uint32_t pad;
	uint64_t off;
};

struct lazy_gate {
	int fd; /* the socket to the fetcher (owned) */
	int nr;
	char names[CHAIN_MAX_LAYERS][CHAIN_NAME_MAX];
	uint64_t *known[CHAIN_MAX_LAYERS]; /* bit c: chunk c of layer i is present */
	uint64_t chunks[CHAIN_MAX_LAYERS];
	uint64_t asked, waited_us; /* requests that waited, and how long in all */
};

/*
 * A gate over memory layers 0..nr-1 of chain c (their file sizes in `sizes`), talking on fd
 * (owned from here on, closed by lazy_gate_free). NULL (out of memory) or the gate.
 */
struct lazy_gate *lazy_gate_new(int fd, const struct chain *c, int nr, const uint64_t *sizes);
void lazy_gate_free(struct lazy_gate *g);

/*
 * Before reading [off, off + len) of layer i: 0 once every chunk it touches is present; with
 * `wait` false, -EAGAIN as soon as one is not. -errno (the fetcher's answer, or the socket's)
 * otherwise.
 */
int lazy_gate_need(struct lazy_gate *g, int i, uint64_t off, uint64_t len, bool wait);

/* One-line text for a gate error (the fetcher's codes). */
const char *lazy_gate_strerror(int r);

#endif
