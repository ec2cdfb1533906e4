/* One S3 request over a curl easy handle: SigV4 set-up, body from a buffer or an fd, reply
 * into a buffer or an fd, every header and byte from the server checked, retries. */
#include "lifecycle/store/s3_internal.h"

#include "common/errmsg.h"
#include "common/file_io.h"
#include "common/hex.h"
#include "common/log.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static size_t read_cb(char *dst, size_t size, size_t nmemb, void *arg)
{
	struct s3_req *r = arg;
	size_t want = size * nmemb;
	uint64_t total = r->body_kind == S3_BODY_BUF ? r->body_len : r->body_fd_len;
	if (r->sent >= total)
		return 0;
	if (want > total - r->sent)
		want = (size_t)(total - r->sent);
	if (r->body_kind == S3_BODY_BUF) {
		memcpy(dst, (const char *)r->body + r->sent, want);
	} else {
		int e = pread_full(r->body_fd, dst, want, r->body_off + (off_t)r->sent);
		if (e) {
			r->sink_err = e;
			return CURL_READFUNC_ABORT;
		}
	}
	r->sent += want;
	if (r->on_read)
		r->on_read(r->on_read_arg, want);
	return want;
}

static int seek_cb(void *arg, curl_off_t off, int origin)
{
	struct s3_req *r = arg;
	if (origin != SEEK_SET || off < 0)
		return CURL_SEEKFUNC_CANTSEEK;
	r->sent = (uint64_t)off;
	return CURL_SEEKFUNC_OK;
}

static size_t write_cb(char *src, size_t size, size_t nmemb, void *arg)
{
	struct s3_req *r = arg;
	size_t n = size * nmemb;
	if (r->status < 200 || r->status > 299) {
		/* an error reply: keep its head for the <Code>, drop the rest */
		size_t room = sizeof(r->errbody) - 1 - r->errbody_len;
		size_t k = n < room ? n : room;
		memcpy(r->errbody + r->errbody_len, src, k);
		r->errbody_len += k;
		return n;
	}
	switch (r->sink_kind) {
	case S3_SINK_BUF:
		if (n > r->out_cap - r->received) {
			r->sink_err = -EFBIG;
			return 0;
		}
		memcpy(r->out + r->received, src, n);
		break;
	case S3_SINK_FD: {
		if (n > r->out_fd_cap - r->received) {
			r->sink_err = -EFBIG;
			return 0;
		}
		int e = pwrite_full(r->out_fd, src, n, r->out_fd_off + (off_t)r->received);
		if (e) {
			r->sink_err = e;
			return 0;
		}
		break;
	}
	case S3_SINK_NONE:
		if (n > S3_ERROR_BODY_MAX) {
			r->sink_err = -EFBIG;
			return 0;
		}
		break;
	}
	r->received += n;
	return n;
}

/* A strictly decimal number that fits in 63 bits. */
static bool parse_u64(const char *s, const char *end, uint64_t *out)
{
	uint64_t v = 0;
	if (s == end)
		return false;
	for (; s < end; s++) {
		if (*s < '0' || *s > '9' || v > (UINT64_MAX / 2 - 9) / 10)
			return false;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	*out = v;
	return true;
}

static size_t header_cb(char *line, size_t size, size_t nmemb, void *arg)
{
	struct s3_req *r = arg;
	size_t n = size * nmemb;
	if (n >= 5 && !strncmp(line, "HTTP/", 5)) {
		/* a new reply (an interim 100 or the final one): forget the previous headers */
		char buf[32];
		size_t k = n < sizeof(buf) - 1 ? n : sizeof(buf) - 1;
		memcpy(buf, line, k);
		buf[k] = '\0';
		const char *sp = strchr(buf, ' ');
		r->status = sp ? strtol(sp + 1, NULL, 10) : 0;
		r->have_cl = false;
		r->content_range[0] = r->etag[0] = '\0';
		return n;
	}
	const char *colon = memchr(line, ':', n);
	if (!colon)
		return n;
	size_t nl = (size_t)(colon - line);
	const char *v = colon + 1, *end = line + n;
	while (v < end && (*v == ' ' || *v == '\t'))
		v++;
	while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' '))
		end--;
	size_t vl = (size_t)(end - v);
	if (nl == 14 && !strncasecmp(line, "Content-Length", 14)) {
		if (!parse_u64(v, end, &r->content_length))
			r->header_bad = true;
		r->have_cl = true;
	} else if (nl == 13 && !strncasecmp(line, "Content-Range", 13)) {
		if (vl >= sizeof(r->content_range))
			r->header_bad = true;
		else
			memcpy(r->content_range, v, vl), r->content_range[vl] = '\0';
	} else if (nl == 4 && !strncasecmp(line, "ETag", 4)) {
		bool ok = vl <= S3_ETAG_MAX;
		for (size_t i = 0; ok && i < vl; i++)
			ok =
			    v[i] > 0x20 && v[i] < 0x7f && v[i] != '<' && v[i] != '>' && v[i] != '&';
		if (!ok)
			r->header_bad = true;
		else
			memcpy(r->etag, v, vl), r->etag[vl] = '\0';
	}
	return n;
}

static int add_header(struct s3_req *r, const char *h)
{
	struct curl_slist *l = curl_slist_append(r->headers, h);
	if (!l)
		return -ENOMEM;
	r->headers = l;
	return 0;
}

/* The payload hash SigV4 signs: the SHA-256 of a body we hold; for a streamed body over TLS
 * UNSIGNED-PAYLOAD (TLS protects it), over plain http its hash from a first pass. */
static int payload_hash(struct s3_client *c, struct s3_req *r)
{
	if (r->body_kind == S3_BODY_BUF) {
		s3_sha256_hex(r->body, r->body_len, r->payload_hash);
		return 0;
	}
	if (r->body_kind == S3_BODY_NONE) {
		s3_sha256_hex("", 0, r->payload_hash);
		return 0;
	}
	if (!c->cfg.insecure_http) {
		strcpy(r->payload_hash, "UNSIGNED-PAYLOAD");
		return 0;
	}
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	char *buf = malloc(1 << 16);
	int e = ctx && buf && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) ? 0 : -ENOMEM;
	for (uint64_t done = 0; !e && done < r->body_fd_len;) {
		size_t k =
		    r->body_fd_len - done < (1 << 16) ? (size_t)(r->body_fd_len - done) : (1 << 16);
		e = pread_full(r->body_fd, buf, k, r->body_off + (off_t)done);
		if (!e)
			EVP_DigestUpdate(ctx, buf, k);
		done += k;
	}
	if (!e) {
		unsigned char md[32];
		EVP_DigestFinal_ex(ctx, md, NULL);
		hex_encode(md, sizeof(md), r->payload_hash);
	}
	free(buf);
	EVP_MD_CTX_free(ctx);
	return e;
}

int s3_req_setup(struct s3_client *c, struct s3_req *r, CURL *h, char *err, size_t errlen)
{
	char line[STORE_TOKEN_MAX + 64];
	int e;
	r->sent = r->received = 0;
	r->status = 0;
	r->have_cl = r->header_bad = false;
	r->content_length = 0;
	r->content_range[0] = r->etag[0] = r->curl_err[0] = '\0';
	r->sink_err = 0;
	r->errbody_len = 0;
	r->headers = NULL;
	if (s3_url(c, r->key, r->query, r->url, sizeof(r->url)))
		return errmsg(err, errlen, -ENAMETOOLONG, "s3 %s: URL too long", r->method);
	if (!r->payload_hash[0]) {
		e = payload_hash(c, r);
		if (e)
			return errmsg(err, errlen, e, "s3 %s %s: reading the body: %s", r->method,
				      r->key ? r->key : "/", strerror(-e));
	}
	snprintf(line, sizeof(line), "x-amz-content-sha256: %s", r->payload_hash);
	e = add_header(r, line);
	/* No "Expect:" header to turn 100-continue off: curl 7.88 signs the empty header and
	 * radosgw then answers SignatureDoesNotMatch. */
	if (!e && (r->flags & S3_IF_NONE_MATCH))
		e = add_header(r, "If-None-Match: *");
	if (!e && (r->flags & S3_IF_MATCH)) {
		snprintf(line, sizeof(line), "If-Match: %s", r->if_match);
		e = add_header(r, line);
	}
	if (!e && r->range[0]) {
		snprintf(line, sizeof(line), "Range: %s", r->range);
		e = add_header(r, line);
	}
	if (!e && c->cfg.session_token[0]) {
		snprintf(line, sizeof(line), "x-amz-security-token: %s", c->cfg.session_token);
		e = add_header(r, line);
	}
	explicit_bzero(line, sizeof(line));
	if (e)
		return errmsg(err, errlen, e, "s3: out of memory");

	char sigv4[STORE_REGION_MAX + 16];
	snprintf(sigv4, sizeof(sigv4), "aws:amz:%s:s3", c->cfg.region);
	CURLcode cc = CURLE_OK;
#define SET(opt, val)                                                                              \
	do {                                                                                       \
		if (cc == CURLE_OK)                                                                \
			cc = curl_easy_setopt(h, opt, val);                                        \
	} while (0)
	SET(CURLOPT_URL, r->url);
	SET(CURLOPT_PROTOCOLS_STR, c->cfg.insecure_http ? "http,https" : "https");
	SET(CURLOPT_AWS_SIGV4, sigv4);
	SET(CURLOPT_USERNAME, c->cfg.access_key_id);
	SET(CURLOPT_PASSWORD, c->cfg.secret_access_key);
	SET(CURLOPT_SSL_VERIFYPEER, 1L);
	SET(CURLOPT_SSL_VERIFYHOST, 2L);
	if (c->cfg.ca_file[0])
		SET(CURLOPT_CAINFO, c->cfg.ca_file);
	SET(CURLOPT_PROXY, ""); /* never a proxy from the environment */
	SET(CURLOPT_FOLLOWLOCATION, 0L);
	SET(CURLOPT_NOSIGNAL, 1L);
	SET(CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
	SET(CURLOPT_CONNECTTIMEOUT_MS, (long)c->opts.connect_timeout_ms);
	SET(CURLOPT_LOW_SPEED_LIMIT, 1024L);
	SET(CURLOPT_LOW_SPEED_TIME, (long)c->opts.stall_timeout_s);
	SET(CURLOPT_ERRORBUFFER, r->curl_err);
	SET(CURLOPT_HTTPHEADER, r->headers);
	SET(CURLOPT_HEADERFUNCTION, header_cb);
	SET(CURLOPT_HEADERDATA, r);
	SET(CURLOPT_WRITEFUNCTION, write_cb);
	SET(CURLOPT_WRITEDATA, r);
	SET(CURLOPT_PRIVATE, r);
	if (c->resolve)
		SET(CURLOPT_RESOLVE, c->resolve);
	if (r->body_kind != S3_BODY_NONE) {
		SET(CURLOPT_UPLOAD, 1L);
		SET(CURLOPT_READFUNCTION, read_cb);
		SET(CURLOPT_READDATA, r);
		SET(CURLOPT_SEEKFUNCTION, seek_cb);
		SET(CURLOPT_SEEKDATA, r);
		SET(CURLOPT_INFILESIZE_LARGE,
		    (curl_off_t)(r->body_kind == S3_BODY_BUF ? r->body_len : r->body_fd_len));
		if (strcmp(r->method, "PUT"))
			SET(CURLOPT_CUSTOMREQUEST, r->method);
	} else if (!strcmp(r->method, "HEAD")) {
		SET(CURLOPT_NOBODY, 1L);
	} else if (strcmp(r->method, "GET")) {
		SET(CURLOPT_CUSTOMREQUEST, r->method);
	}
#undef SET
	if (cc != CURLE_OK) {
		curl_slist_free_all(r->headers);
		r->headers = NULL;
		return errmsg(err, errlen, -EINVAL, "s3: curl set-up: %s", curl_easy_strerror(cc));
	}
	c->requests++;
	return 0;
}

static int status_errno(long status, unsigned flags)
{
	switch (status) {
	case 404:
		return -ENOENT;
	case 412:
		return flags & S3_IF_NONE_MATCH ? -EEXIST : flags & S3_IF_MATCH ? -ESTALE : -EPROTO;
	case 403:
		return -EACCES;
	case 416:
		return -ERANGE;
	case 501:
		return -EOPNOTSUPP;
	case 400:
		return -EINVAL;
	default:
		return status >= 500 || status == 429 ? -EIO : -EPROTO;
	}
}

/* A ranged reply covers exactly what was asked, or up to the object's end. */
static int check_range(struct s3_req *r, char *err, size_t errlen)
{
	uint64_t want_a = 0, want_b = 0, a, b, total;
	if (sscanf(r->range, "bytes=%" SCNu64 "-%" SCNu64, &want_a, &want_b) != 2)
		return errmsg(err, errlen, -EINVAL, "s3: bad range");
	const char *cr = r->content_range;
	if (r->status != 206 || strncmp(cr, "bytes ", 6))
		return errmsg(err, errlen, -EBADMSG,
			      "s3 GET %s: asked for %s, got HTTP %ld without a byte Content-Range",
			      r->key, r->range, r->status);
	const char *p = cr + 6, *dash = strchr(p, '-'), *slash = dash ? strchr(dash, '/') : NULL;
	if (!dash || !slash || !parse_u64(p, dash, &a) || !parse_u64(dash + 1, slash, &b) ||
	    !parse_u64(slash + 1, slash + 1 + strlen(slash + 1), &total) || b < a || b >= total ||
	    a != want_a || b > want_b || (b < want_b && b != total - 1))
		return errmsg(err, errlen, -EBADMSG,
			      "s3 GET %s: Content-Range \"%s\" does not answer %s", r->key, cr,
			      r->range);
	if (r->received != b - a + 1)
		return errmsg(err, errlen, -EBADMSG,
			      "s3 GET %s: got %" PRIu64 " bytes for Content-Range %s", r->key,
			      r->received, cr);
	return 0;
}

int s3_req_finish(struct s3_client *c, struct s3_req *r, CURLcode cc, bool *retry, char *err,
		  size_t errlen)
{
	(void)c;
	const char *what = r->key ? r->key : c->cfg.bucket;
	curl_slist_free_all(r->headers);
	r->headers = NULL;
	*retry = false;
	if (r->sink_err)
		return errmsg(err, errlen, r->sink_err,
			      r->sink_err == -EFBIG ? "s3 %s %s: the reply is larger than its cap"
						    : "s3 %s %s: local I/O: %s",
			      r->method, what, strerror(-r->sink_err));
	if (cc == CURLE_PEER_FAILED_VERIFICATION || cc == CURLE_SSL_CACERT_BADFILE ||
	    cc == CURLE_SSL_ISSUER_ERROR || cc == CURLE_SSL_PINNEDPUBKEYNOTMATCH)
		return errmsg(err, errlen, -EKEYREJECTED,
			      "s3 %s %s: TLS: the store's certificate is not trusted (%s)",
			      r->method, what,
			      r->curl_err[0] ? r->curl_err : curl_easy_strerror(cc));
	if (cc != CURLE_OK) {
		*retry = s3_retryable(cc, 0);
		return errmsg(err, errlen, -EIO, "s3 %s %s: %s", r->method, what,
			      r->curl_err[0] ? r->curl_err : curl_easy_strerror(cc));
	}
	if (r->header_bad)
		return errmsg(err, errlen, -EBADMSG, "s3 %s %s: a malformed or oversized header",
			      r->method, what);
	if (r->status < 200 || r->status > 299) {
		char code[64] = "";
		s3_xml_error_code(r->errbody, r->errbody_len, code, sizeof(code));
		*retry = s3_retryable(CURLE_OK, r->status);
		if (r->status == 412 && (r->flags & S3_IF_NONE_MATCH))
			return errmsg(err, errlen, -EEXIST, "s3 PUT %s: already exists (412)",
				      what);
		if (r->status == 412 && (r->flags & S3_IF_MATCH))
			return errmsg(err, errlen, -ESTALE,
				      "s3 PUT %s: changed since ETag %s was read (412)", what,
				      r->if_match);
		return errmsg(err, errlen, status_errno(r->status, r->flags),
			      "s3 %s %s: HTTP %ld%s%s", r->method, what, r->status,
			      code[0] ? " " : "", code);
	}
	if (strcmp(r->method, "HEAD") && r->have_cl && r->received != r->content_length) {
		*retry = true;
		return errmsg(err, errlen, -EBADMSG,
			      "s3 %s %s: got %" PRIu64 " bytes of a %" PRIu64 "-byte reply",
			      r->method, what, r->received, r->content_length);
	}
	if (r->range[0])
		return check_range(r, err, errlen);
	if (r->sink_kind != S3_SINK_NONE && r->status != 200)
		return errmsg(err, errlen, -EBADMSG, "s3 GET %s: HTTP %ld for a whole object", what,
			      r->status);
	return 0;
}

int s3_perform(struct s3_client *c, struct s3_req *r, char *err, size_t errlen)
{
	int max = c->opts.max_attempts;
	for (int attempt = 1;; attempt++) {
		curl_easy_reset(c->easy);
		int e = s3_req_setup(c, r, c->easy, err, errlen);
		if (e)
			return e;
		CURLcode cc = curl_easy_perform(c->easy);
		bool retry;
		e = s3_req_finish(c, r, cc, &retry, err, errlen);
		if (!e || !retry)
			return e;
		if (attempt >= max) {
			char first[512];
			snprintf(first, sizeof(first), "%s", err ? err : "");
			return errmsg(err, errlen, e, "%s (gave up after %d attempts)", first,
				      attempt);
		}
		unsigned ms = s3_backoff_ms((unsigned)attempt, c->opts.base_delay_ms,
					    c->opts.max_delay_ms, &c->rng);
		if (c->opts.log)
			log_warn(c->opts.log, "%s; retry %d/%d in %u ms", err, attempt, max - 1,
				 ms);
		c->retries++;
		s3_sleep_ms(ms);
	}
}
