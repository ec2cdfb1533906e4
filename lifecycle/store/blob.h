/*
 * A store blob: one committed file's data runs, self-describing, so a sparse 1 GiB layer is not
 * 1 GiB of zeros in the store (lifecycle/store/STORE.md, "Blobs"):
 *
 *   "COVEBLB1" | size le64 | nr_runs le32 | flags le32 (0) | nr_runs x (off le64, len le64) |
 *   the runs' bytes, in order
 *
 * A blob is named by the "cove-sha256-tree" digest (snapshot/digest.h) of the file it holds,
 * holes read as zeros: the digest the chain records, computed again here from the bytes
 * themselves (never taken from chain.json or anything the VMM wrote).
 */
#ifndef COVE_LIFECYCLE_STORE_BLOB_H
#define COVE_LIFECYCLE_STORE_BLOB_H

#include <stddef.h>
#include <stdint.h>

#include "snapshot/digest.h"

#define STORE_BLOB_MAGIC    "COVEBLB1"
#define STORE_BLOB_HDR	    24u
#define STORE_BLOB_MAX_RUNS 65536u	 /* more: the file is packed as one run */
#define STORE_BLOB_MAX_FILE (1ULL << 40) /* a file a blob may claim, at most */

struct store_blob_info {
	uint64_t size;	   /* the file's size */
	uint64_t data_off; /* where the runs' bytes start in the blob */
	uint64_t data_len; /* their sum */
	uint32_t nr_runs;
};

/*
 * Packs the regular file `in` (its size when called) into `out` (empty, written from offset 0)
 * and hashes what it wrote: digest of the file's content, *blob_len the blob's length; with
 * `chunks`, a malloc'ed copy of its chunks' SHA-256s (digest_chunks_of(size) of them). A file
 * that changes size while packed is -EIO. 0 or -errno with one line in err.
 */
int store_blob_pack(int in, int out, uint8_t digest[DIGEST_LEN], uint64_t *blob_len,
		    uint8_t **chunks, char *err, size_t errlen);

/*
 * Checks a blob (untrusted: from the store) whose bytes are in `blob` (blob_len of them):
 * header, runs in order, inside the file, not overlapping, lengths adding up to what follows,
 * the file at most max_size; then the digest of the file it holds must equal `want`. 0, or
 * -EBADMSG (malformed), -EFBIG (over max_size), -EILSEQ (digest differs), -errno; err names
 * `what` in one line.
 */
int store_blob_verify(int blob, uint64_t blob_len, uint64_t max_size,
		      const uint8_t want[DIGEST_LEN], const char *what,
		      struct store_blob_info *info, char *err, size_t errlen);

/*
 * The same checks in two steps over bytes in memory (a blob fetched by ranges, issue 29): the
 * 24-byte header (magic, flags, the file's size at most max_size, a run map that fits in
 * blob_len), then its run map m (16 * info->nr_runs bytes): *runs malloc'ed, info's data_off and
 * data_len set. 0 or -errno with one line naming `what`.
 */
struct file_run;
int store_blob_header(const uint8_t h[STORE_BLOB_HDR], uint64_t blob_len, uint64_t max_size,
		      const char *what, struct store_blob_info *info, char *err, size_t errlen);
int store_blob_runs(const uint8_t *m, uint64_t blob_len, const char *what,
		    struct store_blob_info *info, struct file_run **runs, char *err, size_t errlen);

/*
 * Writes the file a verified blob holds into `out` (empty): its runs at their offsets, holes
 * left holes, then the size. 0 or -errno with one line in err.
 */
int store_blob_unpack(int blob, const struct store_blob_info *info, int out, char *err,
		      size_t errlen);

#endif
