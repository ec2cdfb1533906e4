/* HTTP proxy request heads: http-parser reads the request line and headers; this file only
 * checks what it found and writes the upstream request in origin form. */
#include "egress_head.h"
#include "common/errmsg.h"

#include <ctype.h>
#include <errno.h>
#include <http_parser.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct span {
	size_t off, len;
};

struct head_ctx {
	const char *base;
	struct span url;
	struct span name[EGRESS_HEADERS_MAX], value[EGRESS_HEADERS_MAX];
	size_t nhdr;
	int last; /* 0 none, 1 field, 2 value: http-parser may split one over two calls */
	bool too_many, done;
};

static void span_add(struct span *s, const char *base, const char *at, size_t len)
{
	if (!s->len)
		s->off = (size_t)(at - base);
	s->len += len; /* the head is parsed in one buffer: pieces are contiguous */
}

static struct head_ctx *ctx_of(http_parser *p)
{
	return p->data;
}

static int on_url(http_parser *p, const char *at, size_t len)
{
	span_add(&ctx_of(p)->url, ctx_of(p)->base, at, len);
	return 0;
}

static int on_field(http_parser *p, const char *at, size_t len)
{
	struct head_ctx *c = ctx_of(p);

	if (c->last != 1) {
		if (c->nhdr == EGRESS_HEADERS_MAX) {
			c->too_many = true;
			return 1;
		}
		c->nhdr++;
	}
	c->last = 1;
	span_add(&c->name[c->nhdr - 1], c->base, at, len);
	return 0;
}

static int on_value(http_parser *p, const char *at, size_t len)
{
	struct head_ctx *c = ctx_of(p);

	if (!c->nhdr)
		return 1;
	c->last = 2;
	span_add(&c->value[c->nhdr - 1], c->base, at, len);
	return 0;
}

static int on_headers_complete(http_parser *p)
{
	ctx_of(p)->done = true;
	return 0;
}

long egress_head_end(const char *buf, size_t len)
{
	size_t n = len < EGRESS_HEAD_MAX ? len : EGRESS_HEAD_MAX;

	for (size_t i = 0; i + 1 < n; i++) {
		if (buf[i] != '\n')
			continue;
		if (buf[i + 1] == '\n')
			return (long)(i + 2);
		if (i + 2 < n && buf[i + 1] == '\r' && buf[i + 2] == '\n')
			return (long)(i + 3);
	}
	return len >= EGRESS_HEAD_MAX ? -E2BIG : 0;
}

/* Hop-by-hop and proxy headers are the proxy's business, never forwarded; Host is rewritten
 * from the checked URL so the upstream serves the host the policy allowed. */
static bool hdr_dropped(const char *name, size_t len)
{
	static const char *const drop[] = {"Host",
					   "Connection",
					   "Proxy-Connection",
					   "Keep-Alive",
					   "Proxy-Authorization",
					   "Proxy-Authenticate",
					   "TE",
					   "Trailer",
					   "Upgrade",
					   NULL};

	for (size_t i = 0; drop[i]; i++)
		if (strlen(drop[i]) == len && !strncasecmp(name, drop[i], len))
			return true;
	return false;
}

/* Header values: visible bytes, spaces and tabs only (no bare CR or other control). */
static bool value_ok(const char *v, size_t len)
{
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)v[i];

		if ((c < 0x20 && c != '\t') || c == 0x7f)
			return false;
	}
	return true;
}

/* Host from the URL into h->host: lower case, checked characters. */
static int take_host(struct egress_head *h, const char *s, size_t len)
{
	if (!len || len >= sizeof(h->host))
		return -EINVAL;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];

		if (!isalnum(c) && !strchr("-._:", c))
			return -EINVAL;
		h->host[i] = (char)tolower(c);
	}
	h->host[len] = '\0';
	return 0;
}

static int take_port(struct egress_head *h, const struct http_parser_url *u, const char *url)
{
	if (!(u->field_set & (1 << UF_PORT)))
		return -EINVAL;
	/* http_parser_url's port is 16 bits: read the digits to refuse 0 and > 65535. */
	long v = 0;
	const char *p = url + u->field_data[UF_PORT].off;

	for (size_t i = 0; i < u->field_data[UF_PORT].len; i++) {
		if (!isdigit((unsigned char)p[i]) || (v = v * 10 + (p[i] - '0')) > 65535)
			return -EINVAL;
	}
	if (v < 1)
		return -EINVAL;
	h->port = (int)v;
	return 0;
}

/* Appends to a buffer of cap bytes; -E2BIG once it would not fit. */
static int put(char *buf, size_t cap, size_t *o, const char *s, size_t n)
{
	if (n > cap - *o)
		return -E2BIG;
	memcpy(buf + *o, s, n);
	*o += n;
	return 0;
}

static int build_fwd(struct egress_head *h, const struct head_ctx *c, const http_parser *p,
		     const struct http_parser_url *u, const char *url)
{
	/* The rewritten head is never much longer than the original: its cap plus our lines. */
	size_t cap = EGRESS_HEAD_MAX + 512, o = 0;
	char *b = malloc(cap), line[400];
	int r = 0, n;

	if (!b)
		return -ENOMEM;
	n = snprintf(line, sizeof(line), "%s ", h->method);
	r = put(b, cap, &o, line, (size_t)n);
	if (u->field_set & (1 << UF_PATH))
		r = r
			?: put(b, cap, &o, url + u->field_data[UF_PATH].off,
			       u->field_data[UF_PATH].len);
	else
		r = r ?: put(b, cap, &o, "/", 1);
	if (u->field_set & (1 << UF_QUERY)) {
		r = r ?: put(b, cap, &o, "?", 1);
		r = r
			?: put(b, cap, &o, url + u->field_data[UF_QUERY].off,
			       u->field_data[UF_QUERY].len);
	}
	if (h->port == 80)
		n = snprintf(line, sizeof(line), " HTTP/%u.%u\r\nHost: %s%s%s\r\n", p->http_major,
			     p->http_minor, strchr(h->host, ':') ? "[" : "", h->host,
			     strchr(h->host, ':') ? "]" : "");
	else
		n = snprintf(line, sizeof(line), " HTTP/%u.%u\r\nHost: %s%s%s:%d\r\n",
			     p->http_major, p->http_minor, strchr(h->host, ':') ? "[" : "", h->host,
			     strchr(h->host, ':') ? "]" : "", h->port);
	r = r ?: put(b, cap, &o, line, (size_t)n);
	for (size_t i = 0; i < c->nhdr && !r; i++) {
		const char *nm = c->base + c->name[i].off, *v = c->base + c->value[i].off;

		if (hdr_dropped(nm, c->name[i].len))
			continue;
		r = put(b, cap, &o, nm, c->name[i].len) ?: put(b, cap, &o, ": ", 2)
		    ?: put(b, cap, &o, v, c->value[i].len) ?: put(b, cap, &o, "\r\n", 2);
	}
	r = r ?: put(b, cap, &o, "Connection: close\r\n\r\n", 21);
	r = r ?: put(b, cap, &o, "", 1); /* NUL-terminated for readers, not counted */
	if (r) {
		free(b);
		return r;
	}
	o--;
	h->fwd = b;
	h->fwd_len = o;
	return 0;
}

int egress_head_parse(const char *buf, size_t len, struct egress_head *h, char *err, size_t errlen)
{
	struct head_ctx *c;
	http_parser_settings s;
	http_parser p;
	struct http_parser_url u;
	const char *url;
	size_t got;
	int r = -EINVAL;

	memset(h, 0, sizeof(*h));
	if (len > EGRESS_HEAD_MAX)
		return errmsg(err, errlen, -EINVAL, "request head over %d bytes", EGRESS_HEAD_MAX);
	c = calloc(1, sizeof(*c));
	if (!c)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	c->base = buf;
	http_parser_settings_init(&s);
	s.on_url = on_url;
	s.on_header_field = on_field;
	s.on_header_value = on_value;
	s.on_headers_complete = on_headers_complete;
	http_parser_init(&p, HTTP_REQUEST);
	p.data = c;
	got = http_parser_execute(&p, &s, buf, len);
	if (c->too_many) {
		errmsg(err, errlen, -EINVAL, "over %d header lines", EGRESS_HEADERS_MAX);
		goto out;
	}
	if (HTTP_PARSER_ERRNO(&p) != HPE_OK || !c->done || got != len) {
		errmsg(err, errlen, -EINVAL, "bad request head (%s)",
		       http_errno_name(HTTP_PARSER_ERRNO(&p)));
		goto out;
	}
	snprintf(h->method, sizeof(h->method), "%s", http_method_str(p.method));
	h->is_connect = p.method == HTTP_CONNECT;
	for (size_t i = 0; i < c->nhdr; i++)
		if (!value_ok(buf + c->value[i].off, c->value[i].len)) {
			errmsg(err, errlen, -EINVAL, "control byte in header %zu", i + 1);
			goto out;
		}
	url = buf + c->url.off;
	http_parser_url_init(&u);
	if (!c->url.len || http_parser_parse_url(url, c->url.len, h->is_connect, &u)) {
		errmsg(err, errlen, -EINVAL, "bad request target");
		goto out;
	}
	if (!h->is_connect) {
		/* Absolute form only, plain http: https goes through CONNECT. */
		if (!(u.field_set & (1 << UF_SCHEMA)) || u.field_data[UF_SCHEMA].len != 4 ||
		    strncasecmp(url + u.field_data[UF_SCHEMA].off, "http", 4)) {
			errmsg(err, errlen, -EINVAL,
			       "request target must be http://host/... (CONNECT for https)");
			goto out;
		}
		if (u.field_set & (1 << UF_USERINFO)) {
			errmsg(err, errlen, -EINVAL, "user info in the request target");
			goto out;
		}
	}
	if (!(u.field_set & (1 << UF_HOST)) ||
	    take_host(h, url + u.field_data[UF_HOST].off, u.field_data[UF_HOST].len)) {
		errmsg(err, errlen, -EINVAL, "bad host in the request target");
		goto out;
	}
	if (!h->is_connect && !(u.field_set & (1 << UF_PORT)))
		h->port = 80;
	else if (take_port(h, &u, url)) {
		errmsg(err, errlen, -EINVAL, "bad port in the request target");
		goto out;
	}
	if (!h->is_connect && (r = build_fwd(h, c, &p, &u, url))) {
		errmsg(err, errlen, r, "request head too long");
		goto out;
	}
	r = 0;
out:
	free(c);
	return r;
}

void egress_head_free(struct egress_head *h)
{
	free(h->fwd);
	h->fwd = NULL;
	h->fwd_len = 0;
}

static int body_put(struct egress_body *b, const char *s, size_t n)
{
	if (n > b->ocap - b->olen) {
		b->overflow = true;
		return -1;
	}
	memcpy(b->out + b->olen, s, n);
	b->olen += n;
	return 0;
}

static int body_on_headers(http_parser *p)
{
	struct egress_body *b = p->data;

	b->chunked = p->flags & F_CHUNKED;
	return 0;
}

static int body_on_body(http_parser *p, const char *at, size_t len)
{
	struct egress_body *b = p->data;
	char hex[24];
	int n;

	if (!b->out) /* the head carries no body bytes */
		return 1;
	if (!b->chunked)
		return body_put(b, at, len) ? 1 : 0;
	n = snprintf(hex, sizeof(hex), "%zx\r\n", len);
	return body_put(b, hex, (size_t)n) || body_put(b, at, len) || body_put(b, "\r\n", 2) ? 1
											     : 0;
}

static int body_on_complete(http_parser *p)
{
	struct egress_body *b = p->data;

	if (b->chunked && b->out && body_put(b, "0\r\n\r\n", 5))
		return 1;
	b->done = true;
	/* Stop right here: what follows is the next request, checked on its own. */
	http_parser_pause(p, 1);
	return 0;
}

int egress_body_init(struct egress_body *b, const char *head, size_t headlen)
{
	size_t n;

	memset(b, 0, sizeof(*b));
	http_parser_settings_init(&b->s);
	b->s.on_headers_complete = body_on_headers;
	b->s.on_body = body_on_body;
	b->s.on_message_complete = body_on_complete;
	http_parser_init(&b->p, HTTP_REQUEST);
	b->p.data = b;
	n = http_parser_execute(&b->p, &b->s, head, headlen);
	if (b->done)
		return n == headlen ? 0 : -EINVAL;
	if (HTTP_PARSER_ERRNO(&b->p) != HPE_OK || n != headlen || b->p.upgrade)
		return -EINVAL;
	return 0;
}

long egress_body_feed(struct egress_body *b, const char *in, size_t len, char *out, size_t outcap,
		      size_t *outlen)
{
	size_t n;

	*outlen = 0;
	if (b->done || !len)
		return 0;
	if (len > EGRESS_BODY_IN)
		len = EGRESS_BODY_IN;
	b->out = out;
	b->ocap = outcap;
	b->olen = 0;
	n = http_parser_execute(&b->p, &b->s, in, len);
	b->out = NULL;
	if (b->overflow || (HTTP_PARSER_ERRNO(&b->p) != HPE_OK && !b->done))
		return -EINVAL;
	if (!b->done && n != len)
		return -EINVAL;
	*outlen = b->olen;
	return (long)n;
}

static int resp_on_headers(http_parser *p)
{
	struct egress_resp *r = p->data;

	r->status = p->status_code;
	/* 1 tells http-parser the answer has no body. */
	return r->head_request && p->status_code >= 200 ? 1 : 0;
}

static int resp_on_complete(http_parser *p)
{
	struct egress_resp *r = p->data;

	/* 1xx answers (100 Continue, 103 Early Hints) come before the final one; 101 would switch
	 * protocols (the proxy never forwards Upgrade): it ends the exchange. */
	if (p->status_code >= 200 || p->status_code == 101) {
		r->final = true;
		http_parser_pause(p, 1);
	}
	return 0;
}

void egress_resp_init(struct egress_resp *r, bool head_request)
{
	memset(r, 0, sizeof(*r));
	r->head_request = head_request;
	http_parser_settings_init(&r->s);
	r->s.on_headers_complete = resp_on_headers;
	r->s.on_message_complete = resp_on_complete;
	http_parser_init(&r->p, HTTP_RESPONSE);
	r->p.data = r;
}

long egress_resp_feed(struct egress_resp *r, const char *in, size_t len)
{
	size_t n;

	if (r->final)
		return 0;
	n = http_parser_execute(&r->p, &r->s, in, len);
	if (!len) {
		/* The end: it completes an answer whose length was "until the upstream closes". */
		r->at_eof = r->final;
		return r->final ? 0 : -EINVAL;
	}
	if (r->final)
		return (long)n;
	if (HTTP_PARSER_ERRNO(&r->p) != HPE_OK || n != len)
		return -EINVAL;
	return (long)n;
}
