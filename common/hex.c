/* Hexadecimal digits: the broker's tokens and keys, percent-escapes and scrub patterns. */
#include "common/hex.h"

#include <errno.h>
#include <string.h>

int hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

void hex_encode(const uint8_t *in, size_t n, char *out)
{
	static const char d[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		out[2 * i] = d[in[i] >> 4];
		out[2 * i + 1] = d[in[i] & 15];
	}
	out[2 * n] = '\0';
}

int hex_decode(const char *in, uint8_t *out, size_t n)
{
	if (strlen(in) != 2 * n)
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		int hi = hex_digit(in[2 * i]), lo = hex_digit(in[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return -EINVAL;
		out[i] = (uint8_t)(hi << 4 | lo);
	}
	return 0;
}
