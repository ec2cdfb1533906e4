/* Secret scrubbing: literal, base64(url) and hex patterns, longest first, each matched also when
 * percent-, JSON- or HTML-escaped, in any letter case, or spread over lines, replaced by
 * "[REDACTED]". The broker buffers whole responses, so no
 * pattern can straddle a chunk boundary. */
#include "scrub.h"
#include "common/base64.h"
#include "common/hex.h"

#include <errno.h>
#include <stdbool.h>
#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>

/* Patterns match whatever the case of their ASCII letters: a server may echo a secret upper- or
 * lower-cased (an error message, a hex dump). */
static unsigned char fold(unsigned char c)
{
	return c >= 'A' && c <= 'Z' ? (unsigned char)(c + 32) : c;
}

static bool same_folded(const void *a, const void *b, size_t n)
{
	const unsigned char *x = a, *y = b;

	for (size_t i = 0; i < n; i++)
		if (fold(x[i]) != fold(y[i]))
			return false;
	return true;
}

static int add_pattern(struct scrubber *s, const char *p, size_t len)
{
	size_t i, j;

	if (len == 0)
		return 0;
	for (i = 0; i < s->n; i++)
		if (s->len[i] == len && same_folded(s->pat[i], p, len))
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

/* Adds p and, when it holds a base64 character that base64url spells differently, its base64url
 * spelling. */
static int add_b64_pattern(struct scrubber *s, char *p, size_t len)
{
	size_t i;
	int r = add_pattern(s, p, len);

	if (r || (!memchr(p, '+', len) && !memchr(p, '/', len)))
		return r;
	for (i = 0; i < len; i++)
		p[i] = p[i] == '+' ? '-' : p[i] == '/' ? '_' : p[i];
	return add_pattern(s, p, len);
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
	r = add_b64_pattern(s, out, o);
	OPENSSL_cleanse(out, o);
	free(out);
	return r;
}

static int add_hex(struct scrubber *s, const uint8_t *v, size_t len, const char *digits)
{
	char *out = malloc(2 * len + 1);
	size_t i;
	int r;

	if (!out)
		return -ENOMEM;
	for (i = 0; i < len; i++) {
		out[2 * i] = digits[v[i] >> 4];
		out[2 * i + 1] = digits[v[i] & 15];
	}
	r = add_pattern(s, out, 2 * len);
	OPENSSL_cleanse(out, 2 * len);
	free(out);
	return r;
}

int scrub_add(struct scrubber *s, const char *value, size_t len)
{
	const uint8_t *v = (const uint8_t *)value;
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
	b64_encode(v, len, enc);
	r = add_b64_pattern(s, enc, strlen(enc));
	if (!r && strchr(enc, '=')) {	 /* unpadded, as base64url mostly is */
		b64_encode(v, len, enc); /* add_b64_pattern rewrote it */
		r = add_b64_pattern(s, enc, strcspn(enc, "="));
	}
	OPENSSL_cleanse(enc, b64_enc_len(len));
	free(enc);
	for (k = 0; k < 3 && !r; k++)
		r = add_b64_core(s, v, len, k);
	if (!r)
		r = add_hex(s, v, len, "0123456789abcdef");
	if (!r)
		r = add_hex(s, v, len, "0123456789ABCDEF");
	return r;
}

/* n hex digits at b[0..n) (inside the buffer end e) as a number, or -1. */
static long hexn(const char *b, const char *e, int n)
{
	long v = 0;
	int i, d;

	if (e - b < n)
		return -1;
	for (i = 0; i < n; i++) {
		d = hex_digit(b[i]);
		if (d < 0)
			return -1;
		v = v << 4 | d;
	}
	return v;
}

/* cp as UTF-8 into out; the byte count, or 0 for a surrogate or a value past U+10FFFF. */
static size_t utf8_put(long cp, uint8_t out[4])
{
	if (cp < 0 || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	if (cp < 0x80) {
		out[0] = (uint8_t)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (uint8_t)(0xc0 | cp >> 6);
		out[1] = (uint8_t)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (uint8_t)(0xe0 | cp >> 12);
		out[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
		out[2] = (uint8_t)(0x80 | (cp & 0x3f));
		return 3;
	}
	out[0] = (uint8_t)(0xf0 | cp >> 18);
	out[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3f));
	out[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
	out[3] = (uint8_t)(0x80 | (cp & 0x3f));
	return 4;
}

/* An HTML character reference at b ('&'): numeric (&#65; &#x41; &#X41;, ';' optional as
 * browsers read it, leading zeros allowed) or one of the names HTML escapers and attribute
 * encoders write for ASCII characters (&amp; &quot; &apos;, &sol; &equals; ...; ';'
 * required, any case). Returns its length and sets out and *n, or 0. */
static size_t html_entity(const char *b, const char *e, uint8_t out[4], size_t *n)
{
	static const struct {
		const char *name;
		char c;
	} named[] = {
	    {"amp", '&'},   {"lt", '<'},       {"gt", '>'},	{"quot", '"'},	 {"apos", '\''},
	    {"sol", '/'},   {"bsol", '\\'},    {"plus", '+'},	{"equals", '='}, {"colon", ':'},
	    {"semi", ';'},  {"lowbar", '_'},   {"period", '.'}, {"comma", ','},	 {"excl", '!'},
	    {"quest", '?'}, {"num", '#'},      {"dollar", '$'}, {"percnt", '%'}, {"ast", '*'},
	    {"lpar", '('},  {"rpar", ')'},     {"lsqb", '['},	{"rsqb", ']'},	 {"lcub", '{'},
	    {"rcub", '}'},  {"verbar", '|'},   {"vert", '|'},	{"grave", '`'},	 {"commat", '@'},
	    {"hat", '^'},   {"newline", '\n'}, {"tab", '\t'}};
	const char *q = b + 1;
	long cp = 0;
	size_t len;

	if (q < e && *q == '#') {
		bool hex = ++q < e && (*q == 'x' || *q == 'X');
		const char *d0;

		q += hex;
		for (d0 = q; q < e && q - d0 < 10; q++) {
			int d = hex ? hex_digit(*q) : (*q >= '0' && *q <= '9' ? *q - '0' : -1);

			if (d < 0)
				break;
			cp = cp * (hex ? 16 : 10) + d;
		}
		if (q == d0 || (q < e && (hex ? hex_digit(*q) >= 0 : (*q >= '0' && *q <= '9'))))
			return 0;
		*n = utf8_put(cp, out);
		if (!*n)
			return 0;
		q += q < e && *q == ';';
		return (size_t)(q - b);
	}
	for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++) {
		len = strlen(named[i].name);
		if ((size_t)(e - q) > len && q[len] == ';' && same_folded(q, named[i].name, len)) {
			out[0] = (uint8_t)named[i].c;
			*n = 1;
			return len + 2;
		}
	}
	return 0;
}

/* Decodes one escape at b (percent, '+', JSON or an HTML character reference) into out (up to
 * 4 UTF-8 bytes). Returns the escape's length in the buffer and sets *n, or 0 when b holds no
 * escape. */
static size_t unescape(const char *b, const char *e, uint8_t out[4], size_t *n)
{
	long cp, lo;

	*n = 1;
	if (*b == '&')
		return html_entity(b, e, out, n);
	if (*b == '+') {
		out[0] = ' ';
		return 1;
	}
	if (*b == '%') {
		cp = hexn(b + 1, e, 2);
		out[0] = (uint8_t)cp;
		return cp < 0 ? 0 : 3;
	}
	if (*b != '\\' || e - b < 2)
		return 0;
	switch (b[1]) {
	case '/':
	case '"':
	case '\\':
		out[0] = (uint8_t)b[1];
		return 2;
	case 'b':
		out[0] = '\b';
		return 2;
	case 'f':
		out[0] = '\f';
		return 2;
	case 'n':
		out[0] = '\n';
		return 2;
	case 'r':
		out[0] = '\r';
		return 2;
	case 't':
		out[0] = '\t';
		return 2;
	case 'u':
		break;
	default:
		return 0;
	}
	cp = hexn(b + 2, e, 4);
	if (cp < 0)
		return 0;
	if (cp < 0x80) {
		out[0] = (uint8_t)cp;
		return 6;
	}
	if (cp < 0x800) {
		out[0] = (uint8_t)(0xc0 | cp >> 6);
		out[1] = (uint8_t)(0x80 | (cp & 0x3f));
		*n = 2;
		return 6;
	}
	if (cp < 0xd800 || cp > 0xdfff) {
		out[0] = (uint8_t)(0xe0 | cp >> 12);
		out[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
		out[2] = (uint8_t)(0x80 | (cp & 0x3f));
		*n = 3;
		return 6;
	}
	/* A surrogate pair: \uD8xx\uDCxx. */
	if (cp > 0xdbff || e - b < 12 || b[6] != '\\' || b[7] != 'u')
		return 0;
	lo = hexn(b + 8, e, 4);
	if (lo < 0xdc00 || lo > 0xdfff)
		return 0;
	cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
	out[0] = (uint8_t)(0xf0 | cp >> 18);
	out[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3f));
	out[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
	out[3] = (uint8_t)(0x80 | (cp & 0x3f));
	*n = 4;
	return 12;
}

/* The separator run at b between two characters of an occurrence (a server printing one
 * character per line, or wrapping base64): at most SCRUB_MAX_GAP units of white space (raw or
 * escaped: "\n", %0A, &#10;...) or an HTML <br>. Its length, or 0 (none, or too long). */
static size_t gap_at(const char *b, const char *e)
{
	const char *q = b;
	unsigned units = 0;
	uint8_t dec[4];
	size_t n, el;

	while (q < e) {
		el = 0;
		if (*q == ' ' || *q == '\t' || *q == '\r' || *q == '\n')
			el = 1;
		else if (*q == '<') {
			static const char *const br[] = {"<br>", "<br/>", "<br />"};

			for (size_t i = 0; i < 3 && !el; i++)
				if ((size_t)(e - q) >= strlen(br[i]) &&
				    same_folded(q, br[i], strlen(br[i])))
					el = strlen(br[i]);
		} else if ((el = unescape(q, e, dec, &n)) &&
			   (n != 1 || !memchr(" \t\r\n", dec[0], 4) || !dec[0])) {
			el = 0;
		}
		if (!el)
			break;
		if (++units > SCRUB_MAX_GAP)
			return 0;
		q += el;
	}
	return (size_t)(q - b);
}

/* Length of the occurrence of pat that starts at b, or 0. Where a buffer byte is both itself
 * and the start of an escape ('%', '+', '\', '&'), escape_first picks which reading is tried;
 * the caller tries both, so a pattern that contains those bytes is found in plain and escaped
 * text alike. Letters match in either case; separators may stand between characters. */
static size_t match_at(const char *b, const char *e, const char *pat, size_t pl, int escape_first)
{
	const char *q = b;
	size_t j = 0, n, el;
	bool after_gap = false;
	uint8_t dec[4];

	while (j < pl) {
		if (q >= e)
			return 0;
		/* A <br> is a separator before it is a '<' of the pattern (unless the pattern
		 * itself goes on with "<br"): one reading, no backtracking. */
		if (j && !after_gap && *q == '<' &&
		    !(pl - j >= 3 && same_folded(pat + j, "<br", 3)) && (el = gap_at(q, e))) {
			q += el;
			after_gap = true;
			continue;
		}
		el = unescape(q, e, dec, &n);
		if (el && (escape_first || fold(*q) != fold(pat[j])) && n <= pl - j &&
		    same_folded(dec, pat + j, n)) {
			q += el;
			j += n;
		} else if (fold(*q) == fold(pat[j])) {
			q++;
			j++;
		} else if (j && !after_gap && (el = gap_at(q, e))) {
			q += el;
			after_gap = true;
			continue;
		} else {
			return 0;
		}
		after_gap = false;
	}
	return (size_t)(q - b);
}

/* The next occurrence of pat in [b, e): its start in *at and its length, or 0. starts[] marks
 * the bytes an occurrence can begin with, so most of the text is skipped without a call. */
static size_t find_next(const char *b, const char *e, const char *pat, size_t pl,
			const unsigned char starts[256], const char **at)
{
	/* Both readings differ only where the pattern itself holds an escape's first byte. */
	bool ambiguous = memchr(pat, '%', pl) || memchr(pat, '\\', pl) || memchr(pat, '+', pl) ||
			 memchr(pat, '&', pl);
	size_t m;

	for (; b < e; b++) {
		if (!starts[(unsigned char)*b])
			continue;
		m = match_at(b, e, pat, pl, 1);
		if (!m && ambiguous)
			m = match_at(b, e, pat, pl, 0);
		if (m) {
			*at = b;
			return m;
		}
	}
	return 0;
}

char *scrub_apply(const struct scrubber *s, const char *buf, size_t len, size_t *outlen)
{
	const size_t rl = sizeof(SCRUB_REPLACEMENT) - 1;
	unsigned char starts[256] = {0};
	char *cur, *next;
	const char *p, *at = NULL;
	size_t curlen = len, i;

	cur = malloc(len + 1);
	if (!cur)
		return NULL;
	memcpy(cur, buf, len);
	cur[len] = '\0';
	starts['%'] = starts['\\'] = starts['+'] = starts['&'] = 1;
	for (i = 0; i < s->n; i++) {
		size_t pl = s->len[i], o = 0, m, hits = 0;
		const char *end = cur + curlen;
		unsigned char first = fold((unsigned char)s->pat[i][0]);
		unsigned char upper =
		    first >= 'a' && first <= 'z' ? (unsigned char)(first - 32) : first;
		unsigned char was = starts[first], was_upper = starts[upper];

		starts[first] = starts[upper] = 1;
		for (p = cur; (m = find_next(p, end, s->pat[i], pl, starts, &at)); p = at + m)
			hits++;
		if (!hits) {
			starts[upper] = was_upper;
			starts[first] = was;
			continue;
		}
		/* Each occurrence is at least one byte, so hits * rl more bytes always suffice. */
		next = malloc(curlen + hits * rl + 1);
		if (!next) {
			OPENSSL_cleanse(cur, curlen);
			free(cur);
			return NULL;
		}
		for (p = cur; (m = find_next(p, end, s->pat[i], pl, starts, &at)); p = at + m) {
			memcpy(next + o, p, (size_t)(at - p));
			o += (size_t)(at - p);
			memcpy(next + o, SCRUB_REPLACEMENT, rl);
			o += rl;
		}
		starts[upper] = was_upper;
		starts[first] = was;
		memcpy(next + o, p, (size_t)(end - p));
		o += (size_t)(end - p);
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

int scrub_add_credential(struct scrubber *sc, const char *tmpl, const char *username,
			 const char *password)
{
	size_t lu = strlen(username), lp = strlen(password);
	char *both;
	int r = 0;

	if (lp)
		r = scrub_add(sc, password, lp);
	if (!r && lu && tmpl && strstr(tmpl, "{username}"))
		r = scrub_add(sc, username, lu);
	if (r || !lu || !lp)
		return r;
	both = malloc(lu + lp + 2);
	if (!both)
		return -ENOMEM;
	memcpy(both, username, lu);
	both[lu] = ':';
	memcpy(both + lu + 1, password, lp + 1);
	r = scrub_add(sc, both, lu + 1 + lp);
	OPENSSL_cleanse(both, lu + lp + 2);
	free(both);
	return r;
}
