/*
 * A memory layer's blob read by ranges (issue 29): its header, run map and chunk list fetched
 * and checked first (the chunk list must give the blob's digest again, which the MAC'ed manifest
 * names), then any 1 MiB chunk of the file it holds, by one ranged GET of the bytes of the runs
 * inside that chunk, checked against the chunk's SHA-256 before a byte of it is written.
 */
#ifndef COVE_LIFECYCLE_STORE_LAZY_BLOB_H
#define COVE_LIFECYCLE_STORE_LAZY_BLOB_H

#include <stddef.h>
#include <stdint.h>

#include "common/file_io.h"
#include "lifecycle/store/blob.h"
#include "lifecycle/store/s3.h"

struct lazy_blob {
	char what[96]; /* the file's name, for messages */
	uint8_t digest[DIGEST_LEN];
	struct store_blob_info info;
	struct file_run *runs; /* info.nr_runs */
	uint64_t *run_at;      /* where run i's bytes start in the blob */
	uint8_t *chunks;       /* nchunks SHA-256s, checked */
	uint64_t nchunks;
};

/*
 * The blob of file `what` (size bytes, digest d): -ENOENT when the store has no chunk list for it
 * (uploaded before lists existed: fetch it whole), else 0 or -errno with one line.
 */
int lazy_blob_open(struct s3_client *c, const char *what, const uint8_t d[DIGEST_LEN],
		   uint64_t size, struct lazy_blob *b, char *err, size_t errlen);
void lazy_blob_close(struct lazy_blob *b);

/* Chunk k's bytes in the file: [*lo, *hi). */
void lazy_blob_chunk_range(const struct lazy_blob *b, uint64_t k, uint64_t *lo, uint64_t *hi);

/*
 * Fetches chunk k (k < nchunks) into buf (LAZY_CHUNK bytes of scratch), checks it against its
 * SHA-256 (-EILSEQ when it differs), then writes its data runs into `out` at their offsets (holes
 * stay holes). *fetched: the bytes the GET brought. 0 or -errno with one line.
 */
int lazy_blob_fetch_chunk(struct s3_client *c, const struct lazy_blob *b, uint64_t k, uint8_t *buf,
			  int out, uint64_t *fetched, char *err, size_t errlen);

/* True when chunk k of the file in `fd` already holds what its SHA-256 says (buf: scratch). */
int lazy_blob_chunk_present(const struct lazy_blob *b, uint64_t k, int fd, uint8_t *buf);

#endif

/*
 * A pull that fetches memory layer f lazily: its chunk list and run map checked, the file made at
 * its full size in chain_dfd (a sparse file), its first chunks (header and page bitmaps: every
 * chunk below 4 KiB + size / 16 KiB + 4 KiB, whatever the RAM size) fetched and checked, and f
 * recorded in `lazy`. -ENOENT when the store has no chunk list for it (the caller fetches it
 * whole); else 0 or -errno with one line. *fetched: bytes the GETs brought.
 */
struct sbx_lazy;
struct store_file;
int lazy_blob_place(struct s3_client *c, const struct store_file *f, int chain_dfd,
		    struct sbx_lazy *lazy, uint64_t *fetched, char *err, size_t errlen);
/* How many leading chunks of a memory layer file of `size` bytes hold its header and bitmaps. */
uint64_t lazy_meta_chunks(uint64_t size);
/*
 * The files of sandbox directory sbx_dfd still arriving (its store-lazy.json) as manifest
 * entries, for an upload that must not read them (*out malloc'ed; NULL and 0 when none).
 */
size_t lazy_upload_files(int sbx_dfd, struct store_file **out);
