/* One CONNECT tunnel of the egress proxy: TLS from the guest terminated with a leaf of the
 * sandbox CA, requests parsed with http-parser, sent upstream over verified TLS with the
 * credential injected, responses buffered, scrubbed and relayed. Blocking: one thread per
 * tunnel, timeouts on every socket. */
#include "mitm_tls.h"
#include "inject.h"
#include "scrub.h"
#include "wipe_alloc.h"
#include "common/errmsg.h"

#include <arpa/inet.h>
#include <errno.h>
#include <http_parser.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define READ_CHUNK 16384
#define REASON_MAX 128

/* Headers split by http-parser into NUL-terminated strings in a fixed arena. */
struct head {
	char arena[MITM_RESP_HEAD_MAX];
	size_t alen, cap;
	int last; /* 0 none, 1 url, 2 field, 3 value */
	size_t url_off;
	int has_url;
	struct inject_hdr h[INJECT_MAX_HEADERS];
	size_t nh;
	int too_big, too_many;
};

/* The guest's side: request parser and its state. */
struct guest_req {
	http_parser p;
	struct head hd;
	int headers_done, complete, chunked, has_length;
	unsigned long long content_length;
	SSL *up; /* where on_body sends */
	int send_err;
};

/* The upstream's side: response parser, the body bytes not yet scrubbed and sent. */
struct resp {
	http_parser p;
	struct head hd;
	char reason[REASON_MAX + 1];
	size_t reason_len;
	char *body; /* pending: received, not yet scrubbed */
	size_t body_len, body_cap;
	int complete, no_body, bodiless, close_after, head_sent;
	struct tunnel *t;
	const struct scrubber *sc;
	unsigned char safe[256]; /* bytes no spelling of a secret contains: a cut after one
				    never splits an occurrence */
	int fail;		 /* -errno set by a callback, with why */
	const char *why;
};

struct tunnel {
	struct mitm_ca *ca;
	const struct mitm_upstream *up;
	SSL_CTX *srv_ctx, *cli_ctx;
	SSL *guest;
	int guest_fd;
	char in[MITM_HEAD_MAX + READ_CHUNK];
	size_t in_len;
	http_parser_settings req_set, resp_set;
	int last_status; /* the status the guest got for the current request (0: none yet) */
};

static const char *ossl_why(char *buf, size_t cap)
{
	unsigned long e = ERR_get_error();

	if (!e)
		snprintf(buf, cap, "connection failed");
	else
		ERR_error_string_n(e, buf, cap);
	ERR_clear_error();
	return buf;
}

static void set_timeouts(int fd, int ms)
{
	struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* ---- header arena (shared by the request and response parsers) ---- */

static void head_reset(struct head *hd, size_t cap)
{
	hd->alen = 0;
	hd->cap = cap;
	hd->last = 0;
	hd->nh = 0;
	hd->has_url = 0;
	hd->too_big = hd->too_many = 0;
}

/* Ends the string being collected (a NUL after it). */
static void head_end(struct head *hd)
{
	if (hd->last)
		hd->arena[hd->alen++] = '\0';
}

static int head_add(struct head *hd, int kind, const char *at, size_t len)
{
	if (hd->last != kind) {
		head_end(hd);
		if (kind == 2) {
			if (hd->nh == INJECT_MAX_HEADERS) {
				hd->too_many = 1;
				return -1;
			}
			hd->h[hd->nh++].name = hd->arena + hd->alen;
			hd->h[hd->nh - 1].value = "";
		} else if (kind == 3 && hd->nh) {
			hd->h[hd->nh - 1].value = hd->arena + hd->alen;
		} else if (kind == 1) {
			hd->url_off = hd->alen;
			hd->has_url = 1;
		}
		hd->last = kind;
	}
	/* One byte stays free for the NUL head_end writes. */
	if (len > hd->cap || hd->alen + len + 1 > hd->cap) {
		hd->too_big = 1;
		return -1;
	}
	memcpy(hd->arena + hd->alen, at, len);
	hd->alen += len;
	return 0;
}

static const char *head_get(const struct head *hd, const char *name)
{
	size_t i;

	for (i = 0; i < hd->nh; i++)
		if (!strcasecmp(hd->h[i].name, name))
			return hd->h[i].value;
	return NULL;
}

/* ---- guest request callbacks ---- */

static int rq_url(http_parser *p, const char *at, size_t len)
{
	return head_add(&((struct guest_req *)p->data)->hd, 1, at, len);
}

static int rq_field(http_parser *p, const char *at, size_t len)
{
	return head_add(&((struct guest_req *)p->data)->hd, 2, at, len);
}

static int rq_value(http_parser *p, const char *at, size_t len)
{
	return head_add(&((struct guest_req *)p->data)->hd, 3, at, len);
}

static int rq_headers_complete(http_parser *p)
{
	struct guest_req *g = p->data;

	head_end(&g->hd);
	g->hd.last = 0;
	g->headers_done = 1;
	g->chunked = !!(p->flags & F_CHUNKED);
	g->has_length = !!(p->flags & F_CONTENTLENGTH);
	g->content_length = g->has_length ? (unsigned long long)p->content_length : 0;
	return 0;
}

static int ssl_write_all(SSL *s, const void *buf, size_t len)
{
	size_t done = 0;
	int n;

	while (done < len) {
		n = SSL_write(s, (const char *)buf + done,
			      len - done > 1u << 30 ? 1 << 30 : (int)(len - done));
		if (n <= 0) {
			ERR_clear_error();
			return -EIO;
		}
		done += (size_t)n;
	}
	return 0;
}

static int rq_body(http_parser *p, const char *at, size_t len)
{
	struct guest_req *g = p->data;
	char sz[24];
	int r;

	if (g->chunked) {
		snprintf(sz, sizeof(sz), "%zx\r\n", len);
		r = ssl_write_all(g->up, sz, strlen(sz));
		if (!r)
			r = ssl_write_all(g->up, at, len);
		if (!r)
			r = ssl_write_all(g->up, "\r\n", 2);
	} else {
		r = ssl_write_all(g->up, at, len);
	}
	if (r)
		g->send_err = 1;
	return r ? -1 : 0;
}

static int rq_complete(http_parser *p)
{
	struct guest_req *g = p->data;

	g->complete = 1;
	http_parser_pause(p, 1); /* a pipelined request stays in the buffer */
	return 0;
}

/* ---- upstream response callbacks ---- */

static int rs_begin(http_parser *p)
{
	struct resp *r = p->data;

	head_reset(&r->hd, sizeof(r->hd.arena));
	r->reason_len = 0;
	r->reason[0] = '\0';
	r->body_len = 0;
	return 0;
}

static int rs_status(http_parser *p, const char *at, size_t len)
{
	struct resp *r = p->data;
	size_t keep = len > REASON_MAX - r->reason_len ? REASON_MAX - r->reason_len : len;

	memcpy(r->reason + r->reason_len, at, keep);
	r->reason_len += keep;
	r->reason[r->reason_len] = '\0';
	return 0;
}

static int rs_field(http_parser *p, const char *at, size_t len)
{
	return head_add(&((struct resp *)p->data)->hd, 2, at, len);
}

static int rs_value(http_parser *p, const char *at, size_t len)
{
	return head_add(&((struct resp *)p->data)->hd, 3, at, len);
}

static const char *encoded_body(const struct head *hd);
static int send_head(struct resp *r);
static int flush_body(struct resp *r, int all);

static int rs_fail(struct resp *r, int code, const char *why)
{
	r->fail = code;
	r->why = why;
	return -1;
}

static int rs_headers_complete(http_parser *p)
{
	struct resp *r = p->data;
	unsigned status = p->status_code;

	head_end(&r->hd);
	r->hd.last = 0;
	if (status < 200 && status != 101)
		return 0; /* an interim answer: dropped */
	if (status == 101)
		return rs_fail(r, -EPROTO, "upstream switched protocols");
	if (encoded_body(&r->hd))
		return rs_fail(r, -EPROTO,
			       "upstream sent an encoded body the scrubber cannot read");
	r->bodiless = r->no_body || status == 204 || status == 304;
	if (send_head(r))
		return -1;
	return r->no_body ? 1 : 0; /* a HEAD response has no body whatever it says */
}

static int rs_body(http_parser *p, const char *at, size_t len)
{
	struct resp *r = p->data;
	size_t cap;
	char *nb;

	if (r->bodiless)
		return 0;
	if (r->body_len + len > r->body_cap) {
		cap = r->body_cap ? r->body_cap : 16384;
		while (cap < r->body_len + len)
			cap *= 2;
		nb = wipe_realloc(r->body, cap);
		if (!nb)
			return -1;
		r->body = nb;
		r->body_cap = cap;
	}
	memcpy(r->body + r->body_len, at, len);
	r->body_len += len;
	return r->body_len >= MITM_FLUSH_AT ? flush_body(r, 0) : 0;
}

static int rs_complete(http_parser *p)
{
	struct resp *r = p->data;

	/* 1xx interim answers (100 Continue, 103) are dropped; the final one is relayed. */
	if (p->status_code >= 200) {
		if (!r->bodiless &&
		    (flush_body(r, 1) || ssl_write_all(r->t->guest, "0\r\n\r\n", 5)))
			return r->fail ? -1 : rs_fail(r, -EIO, "guest went away");
		r->complete = 1;
		http_parser_pause(p, 1);
	}
	return 0;
}

/* ---- I/O helpers ---- */

/* Some bytes (> 0), 0 at a clean end, or -errno. */
static int ssl_read_some(SSL *s, char *buf, size_t cap)
{
	int n = SSL_read(s, buf, cap > INT32_MAX ? INT32_MAX : (int)cap);
	int e;

	if (n > 0)
		return n;
	e = SSL_get_error(s, n);
	ERR_clear_error();
	if (e == SSL_ERROR_ZERO_RETURN)
		return 0;
	/* SO_RCVTIMEO ran out: the socket BIO reports EAGAIN as a retry. */
	if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ||
	    (e == SSL_ERROR_SYSCALL && (errno == EAGAIN || errno == EWOULDBLOCK)))
		return -ETIMEDOUT;
	return -EIO;
}

/* A short plain-text answer to the guest, then the tunnel ends. */
static void guest_error(struct tunnel *t, int status, const char *why)
{
	const char *reason = status == 400   ? "Bad Request"
			     : status == 403 ? "Forbidden"
			     : status == 413 ? "Payload Too Large"
			     : status == 431 ? "Request Header Fields Too Large"
			     : status == 505 ? "HTTP Version Not Supported"
					     : "Bad Gateway";
	size_t wl = strnlen(why, 400);
	char buf[700];
	int n;

	t->last_status = status;
	n = snprintf(buf, sizeof(buf),
			 "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n"
			 "Connection: close\r\n\r\ncove: %.*s\n",
			 status, reason, wl + 7, (int)wl, why);

	if (n > 0 && (size_t)n < sizeof(buf))
		ssl_write_all(t->guest, buf, (size_t)n);
}

static SSL_CTX *server_ctx(struct mitm_ca *ca, const char *host, char *err, size_t errlen, int *rc)
{
	char why[160];
	SSL_CTX *ctx;
	X509 *leaf;

	*rc = mitm_ca_leaf(ca, host, &leaf, err, errlen);
	if (*rc)
		return NULL;
	ctx = SSL_CTX_new(TLS_server_method());
	if (!ctx || !SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) ||
	    SSL_CTX_use_certificate(ctx, leaf) != 1 ||
	    SSL_CTX_use_PrivateKey(ctx, ca->leaf_key) != 1 || SSL_CTX_check_private_key(ctx) != 1) {
		*rc = errmsg(err, errlen, -ENOMEM, "mitm: server context: %s",
			     ossl_why(why, sizeof(why)));
		SSL_CTX_free(ctx);
		ctx = NULL;
	}
	X509_free(leaf);
	if (ctx)
		SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
	return ctx;
}

static SSL_CTX *client_ctx(const struct mitm_upstream *up, char *err, size_t errlen, int *rc)
{
	static const unsigned char alpn[] = "\x08http/1.1";
	SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
	char why[160];

	*rc = 0;
	if (!ctx || !SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) ||
	    SSL_CTX_set_alpn_protos(ctx, alpn, sizeof(alpn) - 1) != 0) {
		*rc = errmsg(err, errlen, -ENOMEM, "mitm: client context: %s",
			     ossl_why(why, sizeof(why)));
		SSL_CTX_free(ctx);
		return NULL;
	}
	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
	SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION |
				     SSL_OP_IGNORE_UNEXPECTED_EOF);
	if (up->ca_file ? SSL_CTX_load_verify_locations(ctx, up->ca_file, NULL) != 1
			: SSL_CTX_set_default_verify_paths(ctx) != 1) {
		*rc = errmsg(err, errlen, -EINVAL, "mitm: CA bundle %s: %s",
			     up->ca_file ? up->ca_file : "(system)", ossl_why(why, sizeof(why)));
		SSL_CTX_free(ctx);
		return NULL;
	}
	return ctx;
}

/* A verified TLS connection to the pinned upstream address. */
static SSL *upstream_open(struct tunnel *t, int *fdp, char *err, size_t errlen, int *rc)
{
	const struct mitm_upstream *up = t->up;
	unsigned char ip[16];
	char why[200];
	long vr;
	SSL *s = NULL;
	int fd,
	    is_ip = inet_pton(AF_INET, up->host, ip) == 1 || inet_pton(AF_INET6, up->host, ip) == 1;

	*fdp = -1;
	fd = socket(up->addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		*rc = errmsg(err, errlen, -errno, "upstream socket: %s", strerror(errno));
		return NULL;
	}
	set_timeouts(fd, up->timeout_ms > 0 ? up->timeout_ms : MITM_TIMEOUT_MS);
	if (connect(fd, up->addr, up->addrlen) < 0) {
		*rc = errmsg(err, errlen, -errno, "upstream %s: connect: %s", up->host,
			     strerror(errno));
		close(fd);
		return NULL;
	}
	s = SSL_new(t->cli_ctx);
	if (!s || !SSL_set_fd(s, fd) || (!is_ip && !SSL_set_tlsext_host_name(s, up->host)) ||
	    (is_ip ? !X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(s), up->host)
		   : !SSL_set1_host(s, up->host))) {
		*rc = errmsg(err, errlen, -ENOMEM, "upstream: %s", ossl_why(why, sizeof(why)));
		goto fail;
	}
	if (SSL_connect(s) != 1) {
		vr = SSL_get_verify_result(s);
		if (vr != X509_V_OK) {
			ERR_clear_error();
			*rc =
			    errmsg(err, errlen, -EPROTO, "upstream %s: certificate not trusted: %s",
				   up->host, X509_verify_cert_error_string(vr));
		} else {
			*rc = errmsg(err, errlen, -EPROTO, "upstream %s: TLS handshake: %s",
				     up->host, ossl_why(why, sizeof(why)));
		}
		goto fail;
	}
	/* SSL_connect fails on a bad chain or name with SSL_VERIFY_PEER; checked once more. */
	if (SSL_get_verify_result(s) != X509_V_OK || !SSL_get0_peer_certificate(s)) {
		*rc =
		    errmsg(err, errlen, -EPROTO, "upstream %s: certificate not verified", up->host);
		goto fail;
	}
	*fdp = fd;
	*rc = 0;
	return s;
fail:
	SSL_free(s);
	close(fd);
	return NULL;
}

static void upstream_close(SSL *s, int fd)
{
	if (s) {
		SSL_shutdown(s);
		SSL_free(s);
	}
	if (fd >= 0)
		close(fd);
}

/* Reads from the guest until a whole request head is buffered. Returns the head's length, 0
 * when the guest closed before any byte, or -errno (-E2BIG over MITM_HEAD_MAX). */
static long read_head(struct tunnel *t)
{
	char *end;
	int n;

	for (;;) {
		end = t->in_len ? memmem(t->in, t->in_len, "\r\n\r\n", 4) : NULL;
		if (end)
			return end + 4 - t->in;
		if (t->in_len >= MITM_HEAD_MAX)
			return -E2BIG;
		n = ssl_read_some(t->guest, t->in + t->in_len, MITM_HEAD_MAX - t->in_len);
		if (n == 0)
			return t->in_len ? -EPIPE : 0;
		if (n < 0)
			return n;
		t->in_len += (size_t)n;
	}
}

static void consume(struct tunnel *t, size_t n)
{
	memmove(t->in, t->in + n, t->in_len - n);
	t->in_len -= n;
}

static int resp_drop(const char *name, int keep_length)
{
	static const char *const hop[] = {
	    "Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	    "TE",	  "Trailer",	"Upgrade",	    "Transfer-Encoding"};
	size_t i;

	for (i = 0; i < sizeof(hop) / sizeof(hop[0]); i++)
		if (!strcasecmp(name, hop[i]))
			return 1;
	return !keep_length && !strcasecmp(name, "Content-Length");
}

static int printable(const char *s)
{
	for (; *s; s++)
		if (((unsigned char)*s < 0x20 && *s != '\t') || (unsigned char)*s == 0x7f)
			return 0;
	return 1;
}

/* Builds, scrubs and sends the guest's response head: the upstream's headers but the
 * hop-by-hop and framing ones, and "Transfer-Encoding: chunked" for a body (scrubbing changes
 * its length, and it is sent as it comes). */
static int send_head(struct resp *r)
{
	unsigned status = r->p.status_code;
	size_t cap = MITM_RESP_HEAD_MAX + 1024, len, hl = 0, i, n;
	char *head = malloc(cap), *clean = NULL;
	int rc;

	if (!head)
		return rs_fail(r, -ENOMEM, "out of memory");
	r->t->last_status = (int)status;
	len = (size_t)snprintf(head, cap, "HTTP/1.1 %u %s\r\n", status,
			       printable(r->reason) ? r->reason : "");
	for (i = 0; i < r->hd.nh; i++) {
		const struct inject_hdr *h = &r->hd.h[i];

		if (resp_drop(h->name, r->bodiless) || !printable(h->value))
			continue;
		n = strlen(h->name) + strlen(h->value) + 4;
		if (n > cap - len - 128)
			break; /* cannot happen: the arena is smaller than cap */
		len += (size_t)snprintf(head + len, cap - len, "%s: %s\r\n", h->name, h->value);
	}
	len += (size_t)snprintf(head + len, cap - len, "%s%s\r\n",
				r->bodiless ? "" : "Transfer-Encoding: chunked\r\n",
				r->close_after ? "Connection: close\r\n" : "");
	clean = scrub_apply(r->sc, head, len, &hl);
	OPENSSL_cleanse(head, cap);
	free(head);
	if (!clean)
		return rs_fail(r, -ENOMEM, "out of memory");
	r->head_sent = 1;
	rc = ssl_write_all(r->t->guest, clean, hl);
	free(clean);
	return rc ? rs_fail(r, -EIO, "guest went away") : 0;
}

/*
 * Scrubs and sends pending body bytes as one chunk: all of them, or (all = 0) those up to the
 * last byte no occurrence of a secret can contain, so that no occurrence is cut in two. A run
 * of MITM_SCRUB_RUN_MAX bytes without such a byte fails the response.
 */
static int flush_body(struct resp *r, int all)
{
	size_t cut = r->body_len, cl = 0;
	char sz[24], *clean;
	int rc;

	if (!all) {
		while (cut && !r->safe[(unsigned char)r->body[cut - 1]])
			cut--;
		if (!cut)
			return r->body_len > MITM_SCRUB_RUN_MAX
				   ? rs_fail(r, -EFBIG,
					     "upstream body: no place to cut it "
					     "for the scrubber")
				   : 0;
	}
	if (!cut)
		return 0;
	clean = scrub_apply(r->sc, r->body, cut, &cl);
	if (!clean)
		return rs_fail(r, -ENOMEM, "out of memory");
	OPENSSL_cleanse(r->body, cut);
	memmove(r->body, r->body + cut, r->body_len - cut);
	r->body_len -= cut;
	snprintf(sz, sizeof(sz), "%zx\r\n", cl);
	rc = ssl_write_all(r->t->guest, sz, strlen(sz));
	if (!rc)
		rc = ssl_write_all(r->t->guest, clean, cl);
	if (!rc)
		rc = ssl_write_all(r->t->guest, "\r\n", 2);
	free(clean);
	return rc ? rs_fail(r, -EIO, "guest went away") : 0;
}

/* The bytes a cut may follow: none that a pattern holds, nor any escape's. */
static void safe_bytes(const struct scrubber *sc, unsigned char safe[256])
{
	const char *esc = "%+\\ubfnrt/\"0123456789abcdefABCDEF";
	size_t i, j;

	memset(safe, 1, 256);
	if (!sc->n)
		return;
	for (i = 0; i < sc->n; i++)
		for (j = 0; j < sc->len[i]; j++)
			safe[(unsigned char)sc->pat[i][j]] = 0;
	for (; *esc; esc++)
		safe[(unsigned char)*esc] = 0;
}

/* Reads the upstream response and relays it as it comes. 0 or -errno (rs->head_sent: the guest
 * got part of it and the tunnel must close; else it may be told 502). */
static int read_response(struct tunnel *t, SSL *up, struct resp *rs, char *err, size_t errlen)
{
	char *buf = malloc(READ_CHUNK);
	size_t done;
	int n;

	if (!buf)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	while (!rs->complete) {
		n = ssl_read_some(up, buf, READ_CHUNK);
		if (n < 0) {
			free(buf);
			return errmsg(err, errlen, n, "upstream read: %s", strerror(-n));
		}
		done = http_parser_execute(&rs->p, &t->resp_set, buf, (size_t)n);
		if (HTTP_PARSER_ERRNO(&rs->p) == HPE_PAUSED)
			break;
		if (HTTP_PARSER_ERRNO(&rs->p) != HPE_OK || (n > 0 && done != (size_t)n)) {
			OPENSSL_cleanse(buf, READ_CHUNK);
			free(buf);
			if (rs->fail)
				return errmsg(err, errlen, rs->fail, "%s", rs->why);
			if (rs->hd.too_big || rs->hd.too_many)
				return errmsg(err, errlen, -EFBIG, "upstream head too large");
			return errmsg(err, errlen, -EPROTO, "upstream response: %s",
				      http_errno_description(HTTP_PARSER_ERRNO(&rs->p)));
		}
		if (n == 0)
			break;
	}
	OPENSSL_cleanse(buf, READ_CHUNK);
	free(buf);
	if (!rs->complete)
		return errmsg(err, errlen, -EPROTO, "upstream closed before the response ended");
	return 0;
}

/* Sends the request body after its head: the bytes buffered and what the guest still sends. */
static int forward_body(struct tunnel *t, struct guest_req *g, char *err, size_t errlen)
{
	size_t done;
	int n;

	while (!g->complete) {
		if (t->in_len == 0) {
			n = ssl_read_some(t->guest, t->in, sizeof(t->in));
			if (n <= 0)
				return errmsg(err, errlen, n ? n : -EPIPE,
					      "guest closed inside a request body");
			t->in_len = (size_t)n;
		}
		done = http_parser_execute(&g->p, &t->req_set, t->in, t->in_len);
		if (done > t->in_len)
			done = t->in_len;
		consume(t, done);
		if (HTTP_PARSER_ERRNO(&g->p) == HPE_PAUSED)
			break;
		if (HTTP_PARSER_ERRNO(&g->p) != HPE_OK)
			return errmsg(err, errlen, g->send_err ? -EIO : -EPROTO,
				      g->send_err ? "upstream write failed" : "bad request body");
	}
	http_parser_pause(&g->p, 0);
	if (g->chunked && ssl_write_all(g->up, "0\r\n\r\n", 5))
		return errmsg(err, errlen, -EIO, "upstream write failed");
	return 0;
}

/* The name of a body encoding the scrubber cannot see through, or NULL: any Content-Encoding
 * but identity, any Transfer-Encoding but chunked (http-parser decodes only that), in every
 * header of those names. */
static const char *encoded_body(const struct head *hd)
{
	size_t i;

	for (i = 0; i < hd->nh; i++) {
		const char *v = hd->h[i].value + strspn(hd->h[i].value, " \t");

		if (!strcasecmp(hd->h[i].name, "Content-Encoding") && strcasecmp(v, "identity"))
			return "Content-Encoding";
		if (!strcasecmp(hd->h[i].name, "Transfer-Encoding") && strcasecmp(v, "chunked"))
			return "Transfer-Encoding";
	}
	return NULL;
}

/* One request and its response. 1: keep the tunnel, 0: the guest is done, -errno: close. */
static int serve_one(struct tunnel *t, struct guest_req *g, struct resp *rs, char *err,
		     size_t errlen)
{
	const struct mitm_upstream *up = t->up;
	const struct cred_policy *cred = NULL;
	struct scrubber sc = {0};
	struct secret sec;
	struct mitm_request mr;
	struct inject_req ir;
	char *uhead = NULL;
	size_t uhead_len = 0, done;
	long hl;
	SSL *us = NULL;
	int ufd = -1, r, keep, expect, decided = 0;
	const char *ex;

	memset(&sec, 0, sizeof(sec));
	hl = read_head(t);
	if (hl == 0)
		return 0;
	if (hl == -E2BIG) {
		guest_error(t, 431, "request head too large");
		return errmsg(err, errlen, -E2BIG, "request head over %d KiB",
			      MITM_HEAD_MAX / 1024);
	}
	if (hl < 0)
		return errmsg(err, errlen, (int)hl, "guest read: %s", strerror((int)-hl));

	memset(&g->p, 0, sizeof(g->p));
	http_parser_init(&g->p, HTTP_REQUEST);
	g->p.data = g;
	head_reset(&g->hd, sizeof(g->hd.arena));
	g->headers_done = g->complete = g->send_err = 0;
	g->up = NULL;
	done = http_parser_execute(&g->p, &t->req_set, t->in, (size_t)hl);
	if ((HTTP_PARSER_ERRNO(&g->p) != HPE_OK && HTTP_PARSER_ERRNO(&g->p) != HPE_PAUSED) ||
	    !g->headers_done || done != (size_t)hl || !g->hd.has_url) {
		guest_error(t, g->hd.too_many || g->hd.too_big ? 431 : 400, "malformed request");
		return errmsg(err, errlen, -EPROTO, "malformed request from the guest: %s",
			      http_errno_description(HTTP_PARSER_ERRNO(&g->p)));
	}
	consume(t, (size_t)hl);
	if (g->p.http_major != 1 || g->p.http_minor != 1) {
		guest_error(t, 505, "HTTP/1.1 only");
		return errmsg(err, errlen, -EPROTO, "guest sent HTTP/%u.%u", g->p.http_major,
			      g->p.http_minor);
	}
	if (g->p.upgrade) {
		guest_error(t, 400, "no protocol upgrades or CONNECT inside the tunnel");
		return errmsg(err, errlen, -EPROTO, "upgrade refused");
	}
	keep = http_should_keep_alive(&g->p);
	ex = head_get(&g->hd, "Expect");
	expect = ex && !strcasecmp(ex, "100-continue");

	mr.host = up->host;
	mr.port = up->port;
	mr.method = http_method_str(g->p.method);
	mr.target = g->hd.arena + g->hd.url_off;
	mr.h = g->hd.h;
	mr.nh = g->hd.nh;
	t->last_status = 0;
	decided = 1;
	r = up->decide ? up->decide(up->arg, &mr, &cred, &sec, err, errlen) : 0;
	if (r) {
		guest_error(t, r == -EACCES ? 403 : 502, r == -EACCES ? err : "request failed");
		goto out;
	}
	ir.method = mr.method;
	ir.target = mr.target;
	ir.host = up->host;
	ir.port = up->port;
	ir.h = g->hd.h;
	ir.nh = g->hd.nh;
	ir.chunked = g->chunked;
	ir.has_length = g->has_length;
	ir.content_length = g->content_length;
	r = inject_build_head(&ir, cred, cred ? &sec : NULL, &uhead, &uhead_len, err, errlen);
	if (r) {
		guest_error(t, r == -EACCES ? 403 : r == -E2BIG ? 431 : 400, err);
		goto out;
	}
	if (cred) {
		r = inject_scrubber(&sc, cred, &sec);
		if (r) {
			errmsg(err, errlen, r, "scrubber: %s", strerror(-r));
			guest_error(t, 502, "request failed");
			goto out;
		}
	}
	secret_wipe(&sec);
	/* Nothing with the secret is written before the upstream is verified. */
	us = upstream_open(t, &ufd, err, errlen, &r);
	if (!us) {
		guest_error(t, 502, err);
		goto out;
	}
	r = ssl_write_all(us, uhead, uhead_len);
	OPENSSL_cleanse(uhead, uhead_len);
	if (r) {
		errmsg(err, errlen, r, "upstream write failed");
		guest_error(t, 502, err);
		goto out;
	}
	if (expect && !g->complete &&
	    ssl_write_all(t->guest, "HTTP/1.1 100 Continue\r\n\r\n", 25)) {
		r = errmsg(err, errlen, -EIO, "guest went away");
		goto out;
	}
	g->up = us;
	if (!g->complete) {
		r = forward_body(t, g, err, errlen);
		if (r) {
			guest_error(t, 502, err);
			goto out;
		}
	} else {
		http_parser_pause(&g->p, 0);
	}

	memset(&rs->p, 0, sizeof(rs->p));
	http_parser_init(&rs->p, HTTP_RESPONSE);
	rs->p.data = rs;
	rs->complete = rs->head_sent = rs->bodiless = rs->fail = 0;
	rs->no_body = g->p.method == HTTP_HEAD;
	rs->close_after = !keep;
	rs->body_len = 0;
	rs->t = t;
	rs->sc = &sc;
	safe_bytes(&sc, rs->safe);
	head_reset(&rs->hd, sizeof(rs->hd.arena));
	r = read_response(t, us, rs, err, errlen);
	if (r && !rs->head_sent)
		guest_error(t, 502, err);
	if (!r)
		r = keep ? 1 : 0;
out:
	if (rs->body)
		OPENSSL_cleanse(rs->body, rs->body_len);
	rs->body_len = 0;
	if (uhead) {
		OPENSSL_cleanse(uhead, uhead_len);
		free(uhead);
	}
	secret_wipe(&sec);
	scrub_free(&sc);
	upstream_close(us, ufd);
	if (decided && up->done)
		up->done(up->arg, &mr, t->last_status, r < 0 ? r : 0);
	return r;
}

int mitm_serve(struct mitm_ca *ca, int guest_fd, const struct mitm_upstream *up, char *err,
	       size_t errlen)
{
	struct tunnel *t = calloc(1, sizeof(*t));
	struct guest_req *g = calloc(1, sizeof(*g));
	struct resp *rs = calloc(1, sizeof(*rs));
	struct timespec zero = {0, 0};
	sigset_t pipe_set, old_set;
	char why[160];
	int r;

	/* OpenSSL writes to the sockets with write(): a peer that went away must not kill the
	 * process with SIGPIPE. Blocked for this thread only, and any pending one consumed. */
	sigemptyset(&pipe_set);
	sigaddset(&pipe_set, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);

	if (!t || !g || !rs) {
		r = errmsg(err, errlen, -ENOMEM, "out of memory");
		goto out;
	}
	if (!up->addr || !up->host) {
		r = errmsg(err, errlen, -EINVAL, "mitm: no upstream address");
		goto out;
	}
	t->ca = ca;
	t->up = up;
	t->guest_fd = guest_fd;
	http_parser_settings_init(&t->req_set);
	t->req_set.on_url = rq_url;
	t->req_set.on_header_field = rq_field;
	t->req_set.on_header_value = rq_value;
	t->req_set.on_headers_complete = rq_headers_complete;
	t->req_set.on_body = rq_body;
	t->req_set.on_message_complete = rq_complete;
	http_parser_settings_init(&t->resp_set);
	t->resp_set.on_message_begin = rs_begin;
	t->resp_set.on_status = rs_status;
	t->resp_set.on_header_field = rs_field;
	t->resp_set.on_header_value = rs_value;
	t->resp_set.on_headers_complete = rs_headers_complete;
	t->resp_set.on_body = rs_body;
	t->resp_set.on_message_complete = rs_complete;

	set_timeouts(guest_fd, up->timeout_ms > 0 ? up->timeout_ms : MITM_TIMEOUT_MS);
	t->srv_ctx = server_ctx(ca, up->host, err, errlen, &r);
	if (!t->srv_ctx)
		goto out;
	t->cli_ctx = client_ctx(up, err, errlen, &r);
	if (!t->cli_ctx)
		goto out;
	t->guest = SSL_new(t->srv_ctx);
	if (!t->guest || !SSL_set_fd(t->guest, guest_fd)) {
		r = errmsg(err, errlen, -ENOMEM, "mitm: %s", ossl_why(why, sizeof(why)));
		goto out;
	}
	if (SSL_accept(t->guest) != 1) {
		r = errmsg(err, errlen, -EPROTO, "guest TLS handshake: %s",
			   ossl_why(why, sizeof(why)));
		goto out;
	}
	do
		r = serve_one(t, g, rs, err, errlen);
	while (r == 1);
	if (r == 0)
		SSL_shutdown(t->guest);
out:
	if (t) {
		SSL_free(t->guest);
		SSL_CTX_free(t->srv_ctx);
		SSL_CTX_free(t->cli_ctx);
		OPENSSL_cleanse(t->in, sizeof(t->in));
		free(t);
	}
	if (rs) {
		if (rs->body)
			OPENSSL_cleanse(rs->body, rs->body_cap);
		free(rs->body);
		free(rs);
	}
	free(g);
	while (sigtimedwait(&pipe_set, NULL, &zero) == SIGPIPE)
		;
	pthread_sigmask(SIG_SETMASK, &old_set, NULL);
	return r;
}
