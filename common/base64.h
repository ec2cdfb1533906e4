/* Base64 (RFC 4648): one encoder and decoder for the broker, cove-init and cove-fetch. */
#ifndef COVE_BASE64_H
#define COVE_BASE64_H

#include <stddef.h>
#include <stdint.h>

/* Characters b64_encode writes for n bytes, without the terminating NUL. */
static inline size_t b64_enc_len(size_t n)
{
	return 4 * ((n + 2) / 3);
}

/* Standard alphabet with padding: writes b64_enc_len(n) characters and a NUL to out. */
void b64_encode(const uint8_t *in, size_t n, char *out);

/* Strict decode (standard alphabet, length a multiple of 4, '=' only at the end). out holds at
 * least 3*n/4 bytes. Returns 0 or -EINVAL. */
int b64_decode(const char *in, size_t n, uint8_t *out, size_t *outlen);

/* Lenient decode for what people type (kernel command line, JSON from the host): standard or
 * URL-safe alphabet, padding optional, at most cap bytes out. Returns 0, -EINVAL or -ENOSPC. */
int b64_decode_loose(const char *in, size_t len, uint8_t *out, size_t cap, size_t *out_len);

/* The alphabet character for a 6-bit value (used by the scrubber to build partial forms). */
char b64_char(unsigned v);

#endif
