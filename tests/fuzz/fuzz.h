/* Shared by the libFuzzer targets: a cursor over the input and a quiet fake machine. */
#ifndef COVE_FUZZ_H
#define COVE_FUZZ_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reads the input front to back; past its end every read yields zeros. */
struct fuzz_in {
	const uint8_t *p;
	size_t left;
};

static inline uint64_t fuzz_uint(struct fuzz_in *in, size_t bytes)
{
	uint64_t v = 0;
	for (size_t i = 0; i < bytes; i++) {
		uint8_t b = 0;
		if (in->left) {
			b = *in->p++;
			in->left--;
		}
		v |= (uint64_t)b << (8 * i);
	}
	return v;
}

static inline uint8_t fuzz_u8(struct fuzz_in *in)
{
	return (uint8_t)fuzz_uint(in, 1);
}

static inline uint16_t fuzz_u16(struct fuzz_in *in)
{
	return (uint16_t)fuzz_uint(in, 2);
}

/* Up to `n` bytes of the input (fewer at its end); *got says how many. */
static inline const uint8_t *fuzz_bytes(struct fuzz_in *in, size_t n, size_t *got)
{
	const uint8_t *p = in->p;
	*got = n < in->left ? n : in->left;
	in->p += *got;
	in->left -= *got;
	return p;
}

/* A NUL-terminated malloc'd copy of `len` bytes (NULL only when out of memory). */
static inline char *fuzz_strdup(const uint8_t *p, size_t len)
{
	char *s = malloc(len + 1);
	if (s) {
		memcpy(s, p, len);
		s[len] = '\0';
	}
	return s;
}

#endif
