/* Restore, snapshot side: open a chain layer, validate its memory layers, apply RAM and state. */
#ifndef COVE_SNAPSHOT_RESTORE_H
#define COVE_SNAPSHOT_RESTORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "snapshot/chain.h"
#include "snapshot/layer_restore.h"
#include "snapshot/lazy_mem.h"
#include "snapshot/snap_crypt.h"
#include "snapshot/state_file.h"

struct vm;
struct board;
struct logger;

/* What the host says about the restore; nothing here comes from the chain. */
struct snap_restore_args {
	const char *dir;      /* the chain directory */
	uint64_t layer;	      /* 0: the latest */
	const char *key;      /* key provider spec of an encrypted chain, or NULL */
	int key_relay;	      /* > 2: run that provider through this key relay (a jail); 0: none */
	bool verify;	      /* encrypted: authenticate every stored page before the guest runs */
	const char *snap_dir; /* where the restored sandbox's snapshots go, or NULL */
	/* Where the one-line warnings go (a skipped generation, a chain without digests);
	 * NULL: stderr as "cove: warn: ...". */
	struct logger *log;
	/*
	 * The host checked every digest just before starting this process (chain_verify_stamped,
	 * outside the jail): the restore does not read the files again. Only the host sets it.
	 */
	bool digests_checked;
	/*
	 * > 2: the memory layers may still be arriving from the object store; this is the socket
	 * to the host's fetcher (lazy_gate.h). RAM is then filled by userfaultfd for a plain chain
	 * too, each range read only once the fetcher has it; the fetcher checks every chunk
	 * against its digest, so the restore does not digest those files. 0: none.
	 */
	int lazy_fd;
};

/* One opened layer of a chain: everything restore reads from the chain directory. */
struct snap_restore {
	struct chain chain;
	int idx;	      /* the restored layer's index in chain.layers */
	struct layer_set *ls; /* memory layers 0..idx (snap_restore_validate opens them) */
	bool encrypted;
	struct snap_crypt crypt;
	uint8_t *state; /* the layer's state file, decrypted */
	size_t state_len;
	struct state_section_ref *secs;
	size_t nsecs;
	const struct state_section_ref *config; /* the machine description (SEC_CONFIG) */
	/* The chain records no digests (written before them): nothing was checked, one warning. */
	bool unverified;
	int lazy_fd; /* the args' lazy_fd: RAM through userfaultfd and the gate */
};

/*
 * Open: loads chain.json, picks the layer, opens the key of an encrypted chain (the provider
 * from the host, never from the chain), reads, decrypts and parses the layer's state file.
 * 0 or -errno with one line in `err`; snap_restore_close frees a failed open too.
 */
int snap_restore_open(struct snap_restore *sr, const struct snap_restore_args *a, char *err,
		      size_t errlen);
/*
 * Validate: opens memory layers 0..idx, checks each against the chain and its parent, its
 * encryption against the chain's and (encrypted) authenticates its header and bitmap, and
 * with --verify every stored page. Then, before any guest instruction, every file the restore
 * uses (those memory layers, the state file, the frozen disk layers and maps the machine
 * description names) is read and compared with the SHA-256 digest the chain recorded at
 * commit (snapshot/DIGEST.md): a mismatch is refused with one line naming the file; a chain
 * without digests restores with one warning. Nothing in the directory is changed.
 * 0 or -errno with one line in `err`.
 */
int snap_restore_validate(struct snap_restore *sr, const struct snap_restore_args *a, char *err,
			  size_t errlen);
void snap_restore_close(struct snap_restore *sr);

/* True when the layer restored is the chain's latest (its chain can go on from it). */
bool snap_restore_is_latest(const struct snap_restore *sr);
/*
 * The file RAM is mapped from: the base layer's data (plain chain; the mapping is private), or
 * fd -1 for an encrypted chain (ciphertext cannot be mapped: fresh RAM that userfaultfd fills),
 * or for layers still arriving from the store (a partly fetched file is never mapped).
 */
void snap_restore_ram_backing(const struct snap_restore *sr, int *fd, uint64_t *off);
/*
 * Apply RAM to a VM built on snap_restore_ram_backing: a plain chain's increments are copied
 * over the mapped base (pages_copied says how many); an encrypted chain's pages are served on
 * first touch by `lm`'s thread, which takes the layers. 0 or -errno with one line in `err`.
 */
int snap_restore_apply_ram(struct snap_restore *sr, struct vm *vm, struct lazy_mem *lm,
			   uint64_t *pages_copied, char *err, size_t errlen);
/* Apply the saved vCPU, VM and device state. 0 or -errno with one line in `err`. */
int snap_restore_apply_state(const struct snap_restore *sr, struct vm *vm, struct board *board,
			     char *err, size_t errlen);

#endif
