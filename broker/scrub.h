/* Removing a secret (raw and base64 forms) from data returned to the guest. */
#ifndef COVE_BROKER_SCRUB_H
#define COVE_BROKER_SCRUB_H

#include <stddef.h>
#include <stdint.h>

#define SCRUB_MAX_PATTERNS 16
#define SCRUB_REPLACEMENT  "[REDACTED]"
#define SCRUB_MIN_B64	   6 /* shorter base64 cores are too likely to match by chance */

struct scrubber {
	char *pat[SCRUB_MAX_PATTERNS];
	size_t len[SCRUB_MAX_PATTERNS];
	size_t n;
};

/* Adds value and its base64 forms: the whole encoding, and for each of the three alignments in
 * a longer base64 stream the characters that depend only on value's bytes. Empty values are
 * ignored. Returns 0 or -ENOMEM / -ENOSPC. */
int scrub_add(struct scrubber *s, const char *value, size_t len);

/* Replaces every occurrence of every pattern in buf[0..len) with SCRUB_REPLACEMENT.
 * Returns a new malloc'd buffer (NUL-terminated, *outlen set) or NULL on ENOMEM. */
char *scrub_apply(const struct scrubber *s, const char *buf, size_t len, size_t *outlen);

/* Wipes and frees the patterns. */
void scrub_free(struct scrubber *s);

#endif
