/* Base64 (RFC 4648, standard alphabet) for the broker's JSON bodies and the scrubber. */
#ifndef COVE_BROKER_B64_H
#define COVE_BROKER_B64_H

#include <stddef.h>
#include <stdint.h>

/* Characters b64_encode writes for n bytes, without the terminating NUL. */
static inline size_t b64_enc_len(size_t n)
{
	return 4 * ((n + 2) / 3);
}

/* Writes b64_enc_len(n) characters and a NUL to out. */
void b64_encode(const uint8_t *in, size_t n, char *out);

/* Strict decode (length a multiple of 4, '=' only at the end). out holds at least 3*n/4 bytes.
 * Returns 0 or -EINVAL. */
int b64_decode(const char *in, size_t n, uint8_t *out, size_t *outlen);

/* The alphabet character for a 6-bit value (used by the scrubber to build partial forms). */
char b64_char(unsigned v);

#endif
