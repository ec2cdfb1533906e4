/* Inside the S3 client: the client struct, one request's state, and the shared helpers. */
#ifndef COVE_S3_INTERNAL_H
#define COVE_S3_INTERNAL_H

#include "lifecycle/store/s3.h"

#include <curl/curl.h>
#include <stdbool.h>
#include <stdint.h>

#define S3_URL_MAX 8192

struct s3_client {
	struct store_config cfg;
	struct s3_opts opts;
	CURL *easy; /* reused for one-at-a-time requests (keeps its connection) */
	struct curl_slist *resolve;
	uint64_t rng; /* backoff jitter (xorshift), seeded from getrandom */
	uint64_t requests, retries;
};

enum s3_body { S3_BODY_NONE = 0, S3_BODY_BUF, S3_BODY_FD };
enum s3_sink { S3_SINK_NONE = 0, S3_SINK_BUF, S3_SINK_FD };

/* One request; the caller fills the "in" part, s3_req_* the rest on every attempt. */
struct s3_req {
	/* in */
	const char *method;
	const char *key;   /* the full key (prefix included), NULL for the bucket itself */
	const char *query; /* canonical: sorted, k=v&..., values encoded; NULL for none */
	unsigned flags;	   /* S3_IF_NONE_MATCH, S3_IF_MATCH */
	char if_match[S3_ETAG_MAX + 1]; /* with S3_IF_MATCH: the bare ETag */
	char range[64];			/* a Range header value, or "" */
	enum s3_body body_kind;
	const void *body;
	size_t body_len;
	int body_fd;
	off_t body_off;
	uint64_t body_fd_len;
	enum s3_sink sink_kind;
	char *out;
	size_t out_cap;
	int out_fd;
	off_t out_fd_off;
	uint64_t out_fd_cap;
	void (*on_read)(void *arg, size_t n); /* after each chunk of body read; NULL: none */
	void *on_read_arg;
	/* per attempt */
	char payload_hash[65];
	uint64_t sent;
	uint64_t received;
	long status;
	bool have_cl;
	uint64_t content_length;
	char content_range[96];
	char etag[S3_ETAG_MAX + 1];
	bool header_bad;
	int sink_err;
	char errbody[S3_ERROR_BODY_MAX];
	size_t errbody_len;
	struct curl_slist *headers;
	char url[S3_URL_MAX];
	char curl_err[CURL_ERROR_SIZE];
};

/* "prefix" + key, checked (length, no control bytes); 0 or -errno with err. */
int s3_full_key(const struct s3_client *c, const char *key, char *out, size_t outlen, char *err,
		size_t errlen);
/* Percent-encodes s into out (RFC 3986 unreserved kept; '/' kept when keep_slash). */
int s3_uri_encode(const char *s, bool keep_slash, char *out, size_t outlen);
/* The request URL for key (NULL: the bucket) and query, path-style or virtual-hosted. */
int s3_url(const struct s3_client *c, const char *key, const char *query, char *out, size_t outlen);

/* Removes the configured prefix from a listed key; a key outside it is -EBADMSG. */
int s3_strip_prefix(const struct s3_client *c, char *key, char *err, size_t errlen);

/* Lower-case hex SHA-256 of buf. */
void s3_sha256_hex(const void *buf, size_t len, char out[65]);

/* Sets up h for r (one attempt). 0 or -errno with err. */
int s3_req_setup(struct s3_client *c, struct s3_req *r, CURL *h, char *err, size_t errlen);
/* After the transfer: 0 for a 2xx reply that passes the checks, else -errno with err and
 * *retry telling whether another attempt may succeed. Frees the attempt's header list. */
int s3_req_finish(struct s3_client *c, struct s3_req *r, CURLcode cc, bool *retry, char *err,
		  size_t errlen);
/* One request, retried as s3_retryable says with jittered backoff. */
int s3_perform(struct s3_client *c, struct s3_req *r, char *err, size_t errlen);

/* Retry policy: whether a curl result / HTTP status may succeed on another attempt. */
bool s3_retryable(CURLcode cc, long status);
/* The delay before attempt number `attempt` + 1 (attempt >= 1): full jitter in
 * [base/2, min(max, base * 2^(attempt-1))]. */
unsigned s3_backoff_ms(unsigned attempt, unsigned base_ms, unsigned max_ms, uint64_t *rng);
void s3_sleep_ms(unsigned ms);

/* XML replies (untrusted: capped, checked). Each returns 0 or -EBADMSG with err. */
int s3_xml_error_code(const char *body, size_t len, char *code, size_t codelen);
int s3_xml_upload_id(const char *body, size_t len, char *id, size_t idlen, char *err,
		     size_t errlen);
/* A CompleteMultipartUpload reply: 0 for a result, -EIO with the code for an <Error> (S3 may
 * answer 200 and then an error body), *retry for InternalError/SlowDown. */
int s3_xml_complete(const char *body, size_t len, bool *retry, char *err, size_t errlen);
int s3_xml_list_objects(const char *body, size_t len, size_t max, struct s3_list_page *page,
			char *err, size_t errlen);
int s3_xml_list_uploads(const char *body, size_t len, size_t max, struct s3_upload_entry *out,
			size_t *n, bool *truncated, char *next_key, char *next_id, char *err,
			size_t errlen);

#endif
