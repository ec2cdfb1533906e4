/* term_safe: escapes what a terminal would act on (controls, escape sequences, C1, bidi). */
#include "common/term_safe.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The code point of the valid, shortest-form UTF-8 sequence at p (*len bytes), or -1. */
static long utf8_decode(const unsigned char *p, size_t *len)
{
	long cp, min;
	size_t n, i;

	if (p[0] >= 0xc2 && p[0] <= 0xdf) {
		n = 2, cp = p[0] & 0x1f, min = 0x80;
	} else if (p[0] >= 0xe0 && p[0] <= 0xef) {
		n = 3, cp = p[0] & 0x0f, min = 0x800;
	} else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
		n = 4, cp = p[0] & 0x07, min = 0x10000;
	} else {
		return -1;
	}
	for (i = 1; i < n; i++) {
		if ((p[i] & 0xc0) != 0x80) /* also stops at the NUL */
			return -1;
		cp = cp << 6 | (p[i] & 0x3f);
	}
	if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return -1;
	*len = n;
	return cp;
}

/* Code points a terminal or a text renderer acts on rather than shows. */
static int cp_is_control(long cp)
{
	return (cp >= 0x80 && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029 ||
	       (cp >= 0x200e && cp <= 0x200f) || (cp >= 0x202a && cp <= 0x202e) ||
	       (cp >= 0x2066 && cp <= 0x2069) || cp == 0x061c;
}

/* Escapes p into out (with out NULL only counts), stopping before the first piece that would
 * leave no room in limit bytes for "..." and the NUL. Returns the length. */
static size_t escape(const unsigned char *p, char *out, size_t limit)
{
	size_t o = 0, n, adv;
	char esc[16];
	long cp;

	for (; *p; p += adv) {
		const char *piece = esc;

		adv = 1;
		if (*p < 0x20 || *p == 0x7f) {
			n = (size_t)snprintf(esc, sizeof(esc), "\\x%02x", *p);
		} else if (*p < 0x80) {
			piece = (const char *)p;
			n = 1;
		} else if ((cp = utf8_decode(p, &adv)) < 0) {
			adv = 1;
			n = (size_t)snprintf(esc, sizeof(esc), "\\x%02x", *p);
		} else if (cp_is_control(cp)) {
			n = (size_t)snprintf(esc, sizeof(esc), "\\u%04lx", cp);
		} else {
			piece = (const char *)p;
			n = adv;
		}
		if (out && o + n + 3 + 1 > limit)
			break;
		if (out)
			memcpy(out + o, piece, n);
		o += n;
	}
	return o;
}

char *term_safe(const char *s, char *out, size_t cap)
{
	const unsigned char *p = (const unsigned char *)(s ? s : "");
	size_t o;

	if (cap == 0)
		return out;
	o = escape(p, NULL, 0);
	if (o + 1 <= cap) {
		escape(p, out, SIZE_MAX / 2);
	} else {
		o = escape(p, out, cap);
		if (o + 4 <= cap) {
			memcpy(out + o, "...", 3);
			o += 3;
		}
	}
	out[o] = '\0';
	return out;
}
