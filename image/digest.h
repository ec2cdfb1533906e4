/* Content digests as OCI writes them ("sha256:" and 64 lower-case hex digits), and SHA-256 over
 * a stream. */
#ifndef COVE_IMAGE_DIGEST_H
#define COVE_IMAGE_DIGEST_H
#include <stddef.h>
#include <stdint.h>

#define DIGEST_HEX  64
#define DIGEST_TEXT (7 + DIGEST_HEX + 1) /* "sha256:" + hex + NUL */

/*
 * Pure: "sha256:" then exactly 64 lower-case hex digits (an untrusted descriptor's "digest");
 * the hex goes to hex[65]. 0, or -EINVAL (other algorithms too: only sha256 is taken).
 */
int digest_parse(const char *s, char hex[DIGEST_HEX + 1]);

struct sha256_stream {
	void *ctx; /* EVP_MD_CTX */
	uint64_t bytes;
};
int sha256_begin(struct sha256_stream *s);
void sha256_add(struct sha256_stream *s, const void *p, size_t n);
/* The digest's hex into hex[65]; frees the context (also when it fails). 0 or -EIO. */
int sha256_end(struct sha256_stream *s, char hex[DIGEST_HEX + 1]);
void sha256_abort(struct sha256_stream *s);
/* SHA-256 of a whole buffer into hex[65]: 0 or -ENOMEM/-EIO. */
int sha256_hex(const void *p, size_t n, char hex[DIGEST_HEX + 1]);
#endif
