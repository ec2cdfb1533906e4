/*
 * A sandbox whose memory layers are still arriving from the object store (issue 29): the
 * host's record of them, `store-lazy.json` in the sandbox's directory (never in its chain
 * directory: no VMM can write it). A pull that fetches memory layers lazily writes it; the
 * fetcher (`cove-store lazy`) removes it once every chunk is in place and checked. While it
 * exists, nothing on the host reads those files whole: the host's digest check skips them (the
 * fetcher checks each chunk), an upload names them by the digest recorded here (the store has
 * them), and archive and fork refuse with one line.
 */
#ifndef COVE_LIFECYCLE_LAZY_FILES_H
#define COVE_LIFECYCLE_LAZY_FILES_H

#include <stddef.h>
#include <stdint.h>

#include "snapshot/digest.h"

#define SBX_LAZY_FILE	   "store-lazy.json"
#define SBX_LAZY_LOCK	   "store-lazy.lock" /* held by the fetcher while it runs */
#define SBX_LAZY_MAX_FILES 256
#define SBX_LAZY_NAME_MAX  64

struct sbx_lazy_file {
	char name[SBX_LAZY_NAME_MAX]; /* a memory layer of the chain directory */
	uint64_t size;
	uint8_t digest[DIGEST_LEN];
};

struct sbx_lazy {
	uint64_t generation; /* the store's generation they came from */
	size_t n;
	struct sbx_lazy_file f[SBX_LAZY_MAX_FILES];
};

/* Loads dfd's record: 0, -ENOENT (none: every file is whole), or -errno with one line. */
int sbx_lazy_load(int dfd, struct sbx_lazy *l, char *err, size_t errlen);
/* Writes it (a temporary file, synced, renamed over). 0 or -errno. */
int sbx_lazy_save(int dfd, const struct sbx_lazy *l);
/* True when dfd's sandbox has files still arriving. */
int sbx_lazy_pending(int dfd);
/* The same for sandbox `name` of root r. */
struct sbx_root;
int sbx_lazy_pending_at(const struct sbx_root *r, const char *name);

#endif
