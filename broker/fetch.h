/* Performing one upstream HTTP(S) request with libcurl for the broker. */
#ifndef COVE_BROKER_FETCH_H
#define COVE_BROKER_FETCH_H

#include <curl/curl.h>
#include <stddef.h>
#include <stdint.h>

#define FETCH_BODY_MAX	  (640 * 1024) /* the base64 reply must fit one 1 MiB frame */
#define FETCH_HEADERS_MAX (64 * 1024)
#define FETCH_TIMEOUT_S	  30

struct fetch_req {
	const char *url; /* normalized URL, already checked */
	const char *method;
	const char *const *headers; /* "Name: value" from the guest, already filtered */
	size_t nheaders;
	const char *inject; /* "Name: value" with the secret; wiped by fetch_perform's caller */
	const uint8_t *body;
	size_t body_len;
	const char *pin;     /* CURLOPT_RESOLVE entry or "" */
	const char *ca_file; /* CA bundle for https, NULL = system */
	int allow_private;   /* else a connect to a private address is refused at the socket */
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

/* One transfer in flight: the easy handle and the lists it points at. */
struct fetch {
	CURL *easy;
	struct curl_slist *hdrs; /* includes the injected header: wiped by fetch_end */
	struct curl_slist *pin;
	char cerr[CURL_ERROR_SIZE];
	struct fetch_resp resp;
};

/* Sets up f->easy for req (copies every string, so the caller may wipe req->inject at once).
 * Never follows redirects. Returns 0 or -ENOMEM. Run it with curl_easy_perform or a multi
 * handle, then call fetch_end with the result. */
int fetch_start(struct fetch *f, const struct fetch_req *req, char *err, size_t errlen);

/* Collects the result of a finished transfer and frees the handle (wiping the header list).
 * Returns 0 (f->resp filled), -EFBIG (over the caps) or -EIO, with the error in err. */
int fetch_end(struct fetch *f, CURLcode rc, char *err, size_t errlen);

/* fetch_start + curl_easy_perform + fetch_end. */
int fetch_perform(const struct fetch_req *req, struct fetch_resp *resp, char *err, size_t errlen);
void fetch_resp_free(struct fetch_resp *resp);

/* True for response headers the broker never returns: Set-Cookie (a session the guest must not
 * hold) and framing headers that no longer describe the decoded, scrubbed body. */
int fetch_header_dropped(const char *line, size_t len);

#endif
