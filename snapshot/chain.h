/* A snapshot chain directory: generation files list the layers and their digests; creating one is
 * the commit point. */
#ifndef COVE_CHAIN_H
#define COVE_CHAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CHAIN_FILE	 "chain.json"
#define CHAIN_MAX_LAYERS 256
#define CHAIN_NAME_MAX	 64
#define CHAIN_MAX_BYTES	 (1u << 20)
/*
 * Generation files: "chain.NNNNNNNNNN.json" (ten digits, the generation). A commit creates the
 * next one (never replaces a file: the jailed VMM cannot); chain_load reads the newest that
 * is valid; chain_settle (host side) folds them back into chain.json. See snapshot/DIGEST.md.
 */
#define CHAIN_GEN_PREFIX   "chain."
#define CHAIN_GEN_SUFFIX   ".json"
#define CHAIN_GEN_DIGITS   10
#define CHAIN_GEN_MAX	   9999999999ULL
#define CHAIN_GEN_SCAN_MAX 4096 /* more generation files than this: refused (settle first) */
#define CHAIN_GEN_TRY_MAX  16	/* invalid newest generations skipped before giving up */
/* Digests a chain records: every layer's mem and state, and the frozen disk layers. */
#define CHAIN_MAX_DIGESTS 1024

struct chain_layer {
	uint64_t id, parent; /* parent 0: a full layer */
	bool full;
	char mem[CHAIN_NAME_MAX]; /* file names inside the chain directory */
	char state[CHAIN_NAME_MAX];
	uint64_t present, stored; /* pages held / pages with data */
	uint64_t created_ns;	  /* CLOCK_REALTIME */
};

struct chain_digest {
	char name[CHAIN_NAME_MAX];
	uint8_t sha256[32]; /* snapshot/digest.h: the file's content digest */
};

struct chain {
	char dir[4096];
	uint8_t chain_id[16];
	uint64_t ram_size;
	int nr_layers;
	struct chain_layer layers[CHAIN_MAX_LAYERS];
	/* Set by chain_load / chain_commit: the generation (0: a chain.json without one). */
	uint64_t gen;
	/* Version 2: every layer's mem and state has a digest (chain_parse checks). */
	bool has_digests;
	/* chain_commit: replacing chain.json was refused once (the jail): not tried again. */
	bool no_replace;
	int nr_digests;
	struct chain_digest digests[CHAIN_MAX_DIGESTS];
	/* chain_load: the file read, and one line when a newer generation was skipped (or ""). */
	char source[CHAIN_NAME_MAX];
	char warning[512];
};

/*
 * Reads the newest valid generation of DIR (generation files, then chain.json; capped, every
 * field type- and range-checked, file names must be plain names). A newer generation that
 * does not parse or validate is skipped, once, with one line in c->warning (so a restore
 * says so); at most CHAIN_GEN_TRY_MAX are skipped. -ENOENT when the directory has no chain
 * yet; -EINVAL with a reason in `err` when no generation is valid.
 */
int chain_load(const char *dir, struct chain *c, char *err, size_t errlen);
/* Pure: parses the JSON text of a chain file (any generation; c->gen is what it says). */
int chain_parse(const char *text, size_t len, struct chain *c, char *err, size_t errlen);
/*
 * Commits `c` as the next generation: one past both c->gen and the newest generation file in
 * the directory, written to a fresh temporary file (O_EXCL), fsynced, renamed with
 * RENAME_NOREPLACE, the directory fsynced. Nothing is unlinked or replaced (only the temporary
 * file of a failed commit is removed, best effort). On success c->gen is the new generation.
 */
int chain_commit(struct chain *c, char *err, size_t errlen);
/*
 * Host side only (outside the jail, no VMM running on DIR): writes chain.json from the newest
 * valid generation (temporary file + rename over), then removes, beneath the directory fd and
 * only when they are regular files, the generation files, the temporary files of crashed
 * commits (names cove makes: ".mem-*", ".state-*", ".chain.*" ending in ".tmp") and memory
 * layer and state files (mem-N, mem-N-cK, state-N) the chain no longer lists. Other names,
 * links and directories are left alone. 0 (also when DIR holds no chain) or -errno + `err`.
 */
int chain_settle(const char *dir, char *err, size_t errlen);
/*
 * Host side, outside the jail (no VMM on DIR): checks every file the newest generation records a
 * digest for against it, reading only files whose (device, inode, size, ctime, mtime) and
 * digest differ from a line of `stamps` (a file of the host's, which the VMM cannot write; NULL:
 * read them all), then rewrites `stamps` with the files checked (one changed in the last 100 ms
 * is not stamped: file times come from a coarse clock). A write through a kept fd changes ctime,
 * which no unprivileged process can set back. 0; -EBADMSG with one line naming the file on a
 * mismatch (the stamps then untouched); -ENOENT without a chain; 1 when the chain has no digests.
 */
int chain_verify_stamped(const char *dir, const char *stamps, char *err, size_t errlen);
/*
 * The same, but a file named in `skip` whose recorded digest is the one given there is only
 * checked to be a regular file (a memory layer still arriving from the store: its fetcher checks
 * each chunk against that digest's chunk list), and never stamped.
 */
struct chain_skip {
	const char *name;
	const uint8_t *sha256;
};
int chain_verify_stamped_skip(const char *dir, const char *stamps, const struct chain_skip *skip,
			      int nskip, char *err, size_t errlen);
/*
 * Rewrites `stamps` with every line frozen: its ctime recorded as 0 0, so a check compares
 * device, inode, size and mtime only. For a saved template alone, once every process that could
 * have held one of its files open for writing has exited (its VMM, its jail): each hard link a
 * clone makes changes the files' ctime, which would otherwise make every clone hash every file
 * again. A clone's copy of the stamps stays frozen for the files it shares. 0 or -errno.
 */
int chain_stamps_freeze(const char *stamps);
/*
 * The digest the host checked `name` to have, when file status `st` is still the one it stamped
 * then (chain_verify_stamped's stamp file `stamps`): 0 with out set, -ENOENT when no stamp
 * matches (the file must be read again).
 */
struct stat;
int chain_stamped_digest(const char *stamps, const char *name, const struct stat *st,
			 uint8_t out[32]);
/* The digest recorded for `name`, or NULL. */
const uint8_t *chain_digest_get(const struct chain *c, const char *name);
/* Records (or replaces) the digest of `name`: 0, -EINVAL (bad name) or -E2BIG (table full). */
int chain_digest_set(struct chain *c, const char *name, const uint8_t sha256[32]);
/* Drops digests of memory layer and state files no layer of `c` lists (after compaction). */
void chain_digest_prune(struct chain *c);
/* The newest layer, or NULL for an empty chain. */
const struct chain_layer *chain_latest(const struct chain *c);
/* Writes the hex form of the chain id into out[33]. */
void chain_id_hex(const uint8_t id[16], char out[33]);

#endif
