/* Removing a secret (raw, base64, base64url, hex; percent-, JSON- and HTML-escaped, any letter
 * case, spread over lines) from data returned to the guest. */
#ifndef COVE_BROKER_SCRUB_H
#define COVE_BROKER_SCRUB_H

#include <stddef.h>
#include <stdint.h>

#define SCRUB_MAX_PATTERNS 64
#define SCRUB_REPLACEMENT  "[REDACTED]"
#define SCRUB_MIN_B64	   6 /* shorter base64 cores are too likely to match by chance */
#define SCRUB_MAX_GAP	   8 /* separator units (white space, <br>) between two characters */

struct scrubber {
	char *pat[SCRUB_MAX_PATTERNS];
	size_t len[SCRUB_MAX_PATTERNS];
	size_t n;
};

/* Adds value and its encoded forms: standard and URL-safe base64 (the whole encoding, and for
 * each of the three alignments in a longer base64 stream the characters that depend only on
 * value's bytes) and hex in lower and upper case. Empty values are ignored. Returns 0 or
 * -ENOMEM / -ENOSPC. */
int scrub_add(struct scrubber *s, const char *value, size_t len);

/*
 * The forms of one credential an answer must not carry: the password, the username when the
 * template (tmpl, may be NULL) sends it, and "username:password" (what HTTP Basic encodes).
 * 0 or -ENOMEM.
 */
int scrub_add_credential(struct scrubber *sc, const char *tmpl, const char *username,
			 const char *password);

/* Replaces every occurrence of every pattern in buf[0..len) with SCRUB_REPLACEMENT. An
 * occurrence may spell any of its bytes as a percent escape (%41, %4a or %4A, '+' for a space),
 * a JSON escape (\u0041, \/, \", \\; \uXXXX also for a non-ASCII character) or an HTML
 * character reference (&#65; &#x41; &amp; &quot; ...), in any mix; its ASCII letters in either
 * case; and between any two of its characters up to SCRUB_MAX_GAP units of white space (raw or
 * escaped) or <br> (one character per line, wrapped base64).
 * Returns a new malloc'd buffer (NUL-terminated, *outlen set) or NULL on ENOMEM. */
char *scrub_apply(const struct scrubber *s, const char *buf, size_t len, size_t *outlen);

/* Wipes and frees the patterns. */
void scrub_free(struct scrubber *s);

#endif
