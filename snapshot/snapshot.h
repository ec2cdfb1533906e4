/* Taking snapshots of a running VM into a chain directory: short pause, staged pages, io_uring write, atomic commit. */
#ifndef COVE_SNAPSHOT_H
#define COVE_SNAPSHOT_H

#include <stdbool.h>
#include <stdint.h>

#include "snapshot/chain.h"
#include "snapshot/layer_write.h"
#include "snapshot/snap_crypt.h"

struct vm;
struct board;

/* Staging above this many bytes writes straight from guest RAM while the VM stays paused. */
#define SNAP_DEFAULT_STAGE_MAX (1ULL << 30)
/* A chain longer than this is compacted into one full layer by the next snapshot. */
#define SNAP_DEFAULT_KEEP 16

struct snap_ctx {
	struct vm *vm;
	struct board *board;
	char *config_json; /* how to rebuild this machine (saved in every state file) */
	char dir[4096];
	int dfd;	    /* `dir`, checked as ours: every file is written beneath it (dirfd_io.h) */
	struct chain chain; /* what chain.json says; valid when have_base */
	/* This process holds a base: it wrote a full layer or was restored from the latest one. */
	bool have_base;
	enum write_method method;
	struct layer_ring *ring; /* borrowed; io_uring writes go through it (NULL: one ring each) */
	bool direct;	     /* O_DIRECT where the file system takes it (default; plain layers) */
	uint64_t stage_max;
	int keep;
	uint64_t *bitmap; /* scratch: one bit per RAM page */
	/* Encryption (snapshot/CRYPTO.md): on when a key provider is set. */
	bool encrypted;
	struct keyprov *prov;	 /* owned; the host's provider (never one DIR/keys names) */
	struct snap_crypt crypt; /* data key, opened at the first snapshot */
	/* A new chain's data key (borrowed; NULL: a new key): see keyfile_create_with_key. */
	const struct snap_key *inherit_key;
	uint64_t *stored_bm;	 /* scratch: pages with data, for encrypted layers */
	/* Pre-copy (default; COVE_SNAP_PRECOPY=0 turns it off): pages staged before the pause. */
	bool precopy;
	uint64_t *redirty; /* scratch: pages written again after the pre-copy */
	/* RAM is filled lazily (userfaultfd): a full snapshot must read every page, not the memfd's. */
	bool ram_lazy;
	/* The restored layers may still be arriving from the store: no compaction (it would read
	 * them whole); the chain is compacted by a later restore, once they are. */
	bool layers_arriving;
	/*
	 * Called with the VM paused and its devices quiesced, before the state is saved: the
	 * owner freezes disk overlays (so disk and memory agree) and returns the machine
	 * description to save (malloc'd; it replaces config_json). NULL: nothing to do.
	 */
	int (*prepare)(void *opaque, uint64_t layer_id, char **config_json, char *err,
		       size_t errlen);
	void *prepare_opaque;
};

struct snap_stats {
	uint64_t layer_id;
	bool full;
	bool compacted;
	uint64_t pages;	    /* pages in the layer */
	uint64_t stored;    /* of those, pages with data (not all zeros) */
	uint64_t bytes;	    /* page bytes written */
	uint64_t precopy_us; /* before the pause: dirty pages staged, the guest running */
	uint64_t pause_us;  /* vCPUs stopped */
	uint64_t write_us;  /* after resume: write, sync, commit */
	uint64_t total_us;  /* from the pre-copy to the commit */
	bool staged;	    /* pages were copied out, the VM ran during the write */
};

/*
 * Prepares snapshots of `vm` into `dir` (created if missing). `config_json` is copied.
 * Nothing is written until snap_create.  0 or -errno with a message in `err`.
 */
int snap_ctx_init(struct snap_ctx *s, struct vm *vm, struct board *board, const char *config_json,
		  const char *dir, char *err, size_t errlen);
/* A restored VM continues its chain: the latest layer of `c` is what its RAM now holds. */
void snap_ctx_adopt_chain(struct snap_ctx *s, const struct chain *c);
void snap_ctx_free(struct snap_ctx *s);
/*
 * Encrypts every layer and state file from now on, under a data key wrapped by `prov` (the
 * host's provider, required; taken over by the context).  A directory holding a plain
 * chain is refused. 0 or -errno with a message.
 */
int snap_ctx_encrypt(struct snap_ctx *s, struct keyprov *prov, char *err, size_t errlen);

/*
 * Takes one snapshot.  Full: every page, and the chain starts again from it.  Diff: only pages
 * written since the previous layer (needs a base in this process).  The VM is paused only
 * while the dirty bitmap, device state and pages are collected and staged; chain.json is
 * replaced last, so a crash at any point leaves the previous snapshot restorable.
 * 0 or -errno with a one-line message in `err`; on failure nothing already saved changes
 * and the pages collected go back to the dirty set.
 */
int snap_create(struct snap_ctx *s, bool full, struct snap_stats *st, char *err, size_t errlen);

#endif
