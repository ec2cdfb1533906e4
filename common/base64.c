/* Base64 encode/decode: strict or lenient, bounds-checked, no allocation. */
#include "common/base64.h"

#include <errno.h>
#include <stdbool.h>

static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char b64_char(unsigned v)
{
	return alphabet[v & 63];
}

void b64_encode(const uint8_t *in, size_t n, char *out)
{
	size_t i, o = 0;

	for (i = 0; i + 3 <= n; i += 3) {
		uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
		out[o++] = alphabet[v >> 18 & 63];
		out[o++] = alphabet[v >> 12 & 63];
		out[o++] = alphabet[v >> 6 & 63];
		out[o++] = alphabet[v & 63];
	}
	if (i < n) {
		uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0);
		out[o++] = alphabet[v >> 18 & 63];
		out[o++] = alphabet[v >> 12 & 63];
		out[o++] = i + 1 < n ? alphabet[v >> 6 & 63] : '=';
		out[o++] = '=';
	}
	out[o] = '\0';
}

/* A character's 6-bit value, or -1; url also takes base64url's '-' and '_'. */
static int b64_val(char c, bool url)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == '+' || (url && c == '-'))
		return 62;
	if (c == '/' || (url && c == '_'))
		return 63;
	return -1;
}

int b64_decode(const char *in, size_t n, uint8_t *out, size_t *outlen)
{
	size_t i, o = 0;

	if (n % 4)
		return -EINVAL;
	for (i = 0; i < n; i += 4) {
		int a = b64_val(in[i], false), b = b64_val(in[i + 1], false);
		int c = b64_val(in[i + 2], false), d = b64_val(in[i + 3], false);
		int last = i + 4 == n;

		if (a < 0 || b < 0)
			return -EINVAL;
		if (c < 0 || d < 0) {
			/* Padding: only in the last quantum, "xx==" or "xxx=". */
			if (!last || in[i + 3] != '=' || (c < 0 && in[i + 2] != '='))
				return -EINVAL;
			out[o++] = (uint8_t)(a << 2 | b >> 4);
			if (c >= 0)
				out[o++] = (uint8_t)((b & 15) << 4 | c >> 2);
			break;
		}
		out[o++] = (uint8_t)(a << 2 | b >> 4);
		out[o++] = (uint8_t)((b & 15) << 4 | c >> 2);
		out[o++] = (uint8_t)((c & 3) << 6 | d);
	}
	*outlen = o;
	return 0;
}

int b64_decode_loose(const char *in, size_t len, uint8_t *out, size_t cap, size_t *out_len)
{
	unsigned int acc = 0;
	int bits = 0;
	size_t n = 0, i;

	while (len > 0 && in[len - 1] == '=')
		len--;
	for (i = 0; i < len; i++) {
		int v = b64_val(in[i], true);

		if (v < 0)
			return -EINVAL;
		acc = (acc << 6) | (unsigned int)v;
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			if (n == cap)
				return -ENOSPC;
			out[n++] = (uint8_t)(acc >> bits);
			acc &= (1u << bits) - 1;
		}
	}
	/* A lone sixth-bit group cannot come from any input; leftover bits must be zero. */
	if (bits >= 6 || acc != 0)
		return -EINVAL;
	*out_len = n;
	return 0;
}
