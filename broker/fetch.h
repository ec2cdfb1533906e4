/* Performing one upstream HTTP(S) request with libcurl for the broker. */
#ifndef COVE_BROKER_FETCH_H
#define COVE_BROKER_FETCH_H

#include <stddef.h>
#include <stdint.h>

#define FETCH_BODY_MAX	  (640 * 1024) /* the base64 reply must fit one 1 MiB frame */
#define FETCH_HEADERS_MAX (64 * 1024)
#define FETCH_TIMEOUT_S	  30

struct fetch_req {
	const char *url;      /* normalized URL, already checked */
	const char *method;
	const char *const *headers; /* "Name: value" from the guest, already filtered */
	size_t nheaders;
	const char *inject;   /* "Name: value" with the secret; wiped by fetch_perform's caller */
	const uint8_t *body;
	size_t body_len;
	const char *pin;      /* CURLOPT_RESOLVE entry or "" */
	long timeout_s;
};

struct fetch_resp {
	long status;
	char **headers; /* final response's header lines, without Set-Cookie and framing ones */
	size_t nheaders;
	size_t headers_bytes;
	char *body;
	size_t body_len;
	int too_large;
};

/* Returns 0 (resp filled) or -EIO with curl's error in err. Never follows redirects. */
int fetch_perform(const struct fetch_req *req, struct fetch_resp *resp, char *err, size_t errlen);
void fetch_resp_free(struct fetch_resp *resp);

/* True for response headers the broker never returns: Set-Cookie (a session the guest must not
 * hold) and framing headers that no longer describe the decoded, scrubbed body. */
int fetch_header_dropped(const char *line, size_t len);

#endif
