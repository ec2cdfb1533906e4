/* Secret scrubbing: literal and base64 patterns, longest first, replaced by "[REDACTED]".
 * The broker buffers whole responses, so no pattern can straddle a chunk boundary. */
#include "scrub.h"
#include "b64.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>

static int add_pattern(struct scrubber *s, const char *p, size_t len)
{
	size_t i, j;

	if (len == 0)
		return 0;
	for (i = 0; i < s->n; i++)
		if (s->len[i] == len && !memcmp(s->pat[i], p, len))
			return 0;
	if (s->n == SCRUB_MAX_PATTERNS)
		return -ENOSPC;
	s->pat[s->n] = malloc(len + 1);
	if (!s->pat[s->n])
		return -ENOMEM;
	memcpy(s->pat[s->n], p, len);
	s->pat[s->n][len] = '\0';
	s->len[s->n] = len;
	s->n++;
	/* Keep longest first so a longer form is replaced before a shorter one inside it. */
	for (i = s->n - 1; i > 0 && s->len[i] > s->len[i - 1]; i--) {
		char *tp = s->pat[i];

		j = s->len[i];
		s->pat[i] = s->pat[i - 1];
		s->len[i] = s->len[i - 1];
		s->pat[i - 1] = tp;
		s->len[i - 1] = j;
	}
	return 0;
}

/* The base64 characters, in a stream where value starts k bytes after a 3-byte boundary, whose
 * six bits all come from value: character i covers bits [6i, 6i+6). */
static int add_b64_core(struct scrubber *s, const uint8_t *v, size_t len, unsigned k)
{
	size_t bits = 8 * (k + len), first = (8 * k + 5) / 6, last = bits / 6, i, o = 0;
	char *out;
	int r;

	if (last <= first || last - first < SCRUB_MIN_B64)
		return 0;
	out = malloc(last - first + 1);
	if (!out)
		return -ENOMEM;
	for (i = first; i < last; i++) {
		unsigned val = 0, b;

		for (b = 0; b < 6; b++) {
			size_t bit = 6 * i + b, byte = bit / 8;
			unsigned x = byte < k ? 0 : v[byte - k];

			val = val << 1 | (x >> (7 - bit % 8) & 1);
		}
		out[o++] = b64_char(val);
	}
	r = add_pattern(s, out, o);
	OPENSSL_cleanse(out, o);
	free(out);
	return r;
}

int scrub_add(struct scrubber *s, const char *value, size_t len)
{
	char *enc;
	unsigned k;
	int r;

	if (len == 0)
		return 0;
	r = add_pattern(s, value, len);
	if (r)
		return r;
	enc = malloc(b64_enc_len(len) + 1);
	if (!enc)
		return -ENOMEM;
	b64_encode((const uint8_t *)value, len, enc);
	r = add_pattern(s, enc, strlen(enc));
	OPENSSL_cleanse(enc, b64_enc_len(len));
	free(enc);
	for (k = 0; k < 3 && !r; k++)
		r = add_b64_core(s, (const uint8_t *)value, len, k);
	return r;
}

char *scrub_apply(const struct scrubber *s, const char *buf, size_t len, size_t *outlen)
{
	const size_t rl = sizeof(SCRUB_REPLACEMENT) - 1;
	char *cur, *next;
	size_t curlen = len, i;

	cur = malloc(len + 1);
	if (!cur)
		return NULL;
	memcpy(cur, buf, len);
	cur[len] = '\0';
	for (i = 0; i < s->n; i++) {
		size_t pl = s->len[i], pos = 0, o = 0, hits = 0;
		const char *p;

		for (p = memmem(cur, curlen, s->pat[i], pl); p;
		     p = memmem(p + pl, curlen - (size_t)(p + pl - cur), s->pat[i], pl))
			hits++;
		if (!hits)
			continue;
		next = malloc(curlen - hits * pl + hits * rl + 1);
		if (!next) {
			OPENSSL_cleanse(cur, curlen);
			free(cur);
			return NULL;
		}
		while ((p = memmem(cur + pos, curlen - pos, s->pat[i], pl))) {
			size_t skip = (size_t)(p - (cur + pos));

			memcpy(next + o, cur + pos, skip);
			o += skip;
			memcpy(next + o, SCRUB_REPLACEMENT, rl);
			o += rl;
			pos += skip + pl;
		}
		memcpy(next + o, cur + pos, curlen - pos);
		o += curlen - pos;
		next[o] = '\0';
		OPENSSL_cleanse(cur, curlen);
		free(cur);
		cur = next;
		curlen = o;
	}
	*outlen = curlen;
	return cur;
}

void scrub_free(struct scrubber *s)
{
	size_t i;

	for (i = 0; i < s->n; i++) {
		OPENSSL_cleanse(s->pat[i], s->len[i]);
		free(s->pat[i]);
	}
	s->n = 0;
}
