/* Content digests of committed chain files (memory layers, state files, frozen disk layers). */
#ifndef COVE_DIGEST_H
#define COVE_DIGEST_H

#include <stddef.h>
#include <stdint.h>

#define DIGEST_LEN     32
#define DIGEST_HEX_LEN 65 /* 64 hex digits and a NUL */
#define DIGEST_CHUNK   (1u << 20)

/*
 * The digest of a file's content, "cove-sha256-tree" (snapshot/DIGEST.md):
 *   SHA-256( "cove-sha256-tree" NUL, size as le64, chunk size as le32,
 *            SHA-256(chunk 0) || SHA-256(chunk 1) || ... )
 * over 1 MiB chunks (the last may be short). It depends on the bytes only: a hole and
 * written zeros give the same digest. A chunk that is a hole (SEEK_DATA) or all zeros is
 * not hashed: its SHA-256 is a constant. Layer files are sparse (a Diff of a 1 GiB guest
 * is a 1 GiB file of a few data pages), so a plain SHA-256 would hash every hole; this
 * costs what the data costs, and per-chunk digests can later be checked one at a time.
 */
/* The digest of `len` bytes in memory (what digest_fd gives for a file holding them). */
int digest_buf(const void *p, size_t len, uint8_t out[DIGEST_LEN]);
/* The digest of everything in `fd` (from offset 0 to its size, by pread). 0 or -errno. */
int digest_fd(int fd, uint8_t out[DIGEST_LEN]);
/* The digest of `name` beneath `dfd` (opened read-only, never through a link). 0 or -errno. */
int digest_file_at(int dfd, const char *name, uint8_t out[DIGEST_LEN]);
/*
 * The same digest over bytes that come in order (a blob's data runs and the holes between
 * them): new(size), feed/zeros until size bytes came, finish (-EIO when short), free. Feeding
 * past size is -EOVERFLOW.
 */
struct digest_stream;
int digest_stream_new(uint64_t size, struct digest_stream **out);
int digest_stream_feed(struct digest_stream *s, const void *p, size_t n);
int digest_stream_zeros(struct digest_stream *s, uint64_t n);
int digest_stream_finish(struct digest_stream *s, uint8_t out[DIGEST_LEN]);
void digest_stream_free(struct digest_stream *s);
/*
 * The chunks' own SHA-256s (issue 29: a chunk fetched alone is checked against them): after
 * new, keep_chunks makes the stream record each (-EFBIG past DIGEST_CHUNKS_MAX chunks); after
 * finish, chunks gives them in order (*n of them; owned by the stream).
 */
#define DIGEST_CHUNKS_MAX (1u << 20) /* 1 TiB of file */
int digest_stream_keep_chunks(struct digest_stream *s);
const uint8_t *digest_stream_chunks(const struct digest_stream *s, uint64_t *n);
/* How many chunks a file of `size` bytes has. */
uint64_t digest_chunks_of(uint64_t size);
/* The file digest that n chunk SHA-256s give for a file of `size` bytes (-EINVAL: wrong n). */
int digest_from_chunks(uint64_t size, const uint8_t *hashes, uint64_t n, uint8_t out[DIGEST_LEN]);
/* One chunk's SHA-256 (len bytes: DIGEST_CHUNK, or less for a file's last chunk). */
int digest_chunk(const void *p, size_t len, uint8_t out[DIGEST_LEN]);
/* Lower-case hex into out[DIGEST_HEX_LEN]; exactly 64 hex digits back into bytes (0/-EINVAL). */
void digest_hex(const uint8_t d[DIGEST_LEN], char out[DIGEST_HEX_LEN]);
int digest_unhex(const char *s, uint8_t out[DIGEST_LEN]);
/* SHA-256 of a zero 1 MiB chunk (the constant holes hash to). */
extern const uint8_t digest_zero_chunk[DIGEST_LEN];

/*
 * The frozen disk layer files a machine description (the state file's SEC_CONFIG JSON,
 * sandbox/machine_config.c) names: for each disk's "layers" entry the data file and its map
 * (name + OVERLAY_MAP_SUFFIX), each a plain name shorter than `cap`. Untrusted input:
 * anything malformed is -EINVAL; more than `max` names is -E2BIG. *n is the count.
 */
int digest_config_files(const char *json, size_t len, char (*names)[64], int max, int *n);

#endif
