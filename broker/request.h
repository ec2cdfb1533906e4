/* Parsing and validating one guest request message (pure: bytes in, struct out). */
#ifndef COVE_BROKER_REQUEST_H
#define COVE_BROKER_REQUEST_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define REQ_MAX_HEADERS 64
#define REQ_HEADER_MAX	8192
#define REQ_BODY_MAX	(512 * 1024)
#define REQ_TOKEN_BYTES 16

struct breq {
	json_t *root; /* owns the strings below */
	uint64_t epoch;
	uint8_t token[REQ_TOKEN_BYTES];
	int has_token;
	const char *credential; /* "default" when absent */
	const char *method;
	const char *url;
	const char *headers[REQ_MAX_HEADERS];
	size_t nheaders;
	uint8_t *body; /* decoded body_b64, NULL when absent */
	size_t body_len;
};

/* Parses a request. On -EINVAL err says why in a few words; fields already parsed (credential,
 * method, url) stay set for the audit record. Call breq_free() either way. */
int breq_parse(const uint8_t *msg, size_t len, struct breq *out, char *err, size_t errlen);
void breq_free(struct breq *r);

#endif
