/* Hexadecimal digits: encode, decode, one digit's value. */
#ifndef COVE_HEX_H
#define COVE_HEX_H

#include <stddef.h>
#include <stdint.h>

/* The value of one hex digit (either case), or -1. */
int hex_digit(char c);
/* Lower-case hex of n bytes into out (2n+1 bytes, NUL-terminated). */
void hex_encode(const uint8_t *in, size_t n, char *out);
/* Exactly 2n hex digits into n bytes: 0 or -EINVAL. */
int hex_decode(const char *in, uint8_t *out, size_t n);

#endif
