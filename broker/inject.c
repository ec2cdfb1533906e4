/* Credential injection for the egress proxy: the upstream request head rebuilt from the guest's,
 * the secret only in the policy's header, for the policy's hosts; and the response scrubber. */
#include "inject.h"
#include "common/base64.h"
#include "common/errmsg.h"

#include <ctype.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define PH_LEN (sizeof(INJECT_PLACEHOLDER) - 1)

/* Headers the proxy sets itself or that only concern one hop. */
static const char *const dropped[] = {
    "Connection",
    "Keep-Alive",
    "Proxy-Connection",
    "Proxy-Authorization",
    "Proxy-Authenticate",
    "TE",
    "Trailer",
    "Upgrade",
    "Expect",
    "Transfer-Encoding",
    "Content-Length",
    "Accept-Encoding",
    "Host",
};

struct out {
	char *p;
	size_t len, cap;
	int full;
};

static void put(struct out *o, const char *s, size_t n)
{
	if (o->full || n > o->cap - o->len) {
		o->full = 1;
		return;
	}
	memcpy(o->p + o->len, s, n);
	o->len += n;
}

static void puts_(struct out *o, const char *s)
{
	put(o, s, strlen(s));
}

static int token_ok(const char *s)
{
	if (!*s)
		return 0;
	for (; *s; s++)
		if (!isalnum((unsigned char)*s) && !strchr("!#$%&'*+-.^_`|~", *s))
			return 0;
	return 1;
}

static int value_ok(const char *s)
{
	for (; *s; s++)
		if (((unsigned char)*s < 0x20 && *s != '\t') || *s == 0x7f)
			return 0;
	return 1;
}

static int target_ok(const char *t)
{
	if (t[0] != '/')
		return 0;
	for (; *t; t++)
		if ((unsigned char)*t <= 0x20 || (unsigned char)*t >= 0x7f)
			return 0;
	return 1;
}

static int has_placeholder(const char *s, size_t n)
{
	size_t i;

	for (i = 0; i + PH_LEN <= n; i++)
		if (!strncasecmp(s + i, INJECT_PLACEHOLDER, PH_LEN))
			return 1;
	return 0;
}

static int name_char(char c)
{
	return isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.';
}

/* Copies in[0..n) to out with every "cove-credential:NAME" replaced by pw. Returns the number
 * replaced, -EACCES when one names another credential (or differs in case), -E2BIG. */
static int replace_ph(const char *in, size_t n, const char *name, const char *pw, char *out,
		      size_t cap, size_t *olen)
{
	size_t i = 0, o = 0, nl = strlen(name), pl = strlen(pw), k;
	int found = 0;

	while (i < n) {
		if (i + PH_LEN <= n && !strncasecmp(in + i, INJECT_PLACEHOLDER, PH_LEN)) {
			k = i + PH_LEN;
			while (k < n && name_char(in[k]))
				k++;
			if (strncmp(in + i, INJECT_PLACEHOLDER, PH_LEN) || k - i - PH_LEN != nl ||
			    memcmp(in + i + PH_LEN, name, nl))
				return -EACCES;
			if (pl > cap - o)
				return -E2BIG;
			memcpy(out + o, pw, pl);
			o += pl;
			i = k;
			found++;
			continue;
		}
		if (o + 1 > cap)
			return -E2BIG;
		out[o++] = in[i++];
	}
	*olen = o;
	return found;
}

/* The template with {password} and {username} filled. Returns 0 or -E2BIG. */
static int fill(const char *tpl, const struct secret *s, char *out, size_t cap, size_t *olen)
{
	size_t o = 0, n;
	const char *t, *v;

	for (t = tpl; *t;) {
		v = !strncmp(t, "{password}", 10)   ? s->password
		    : !strncmp(t, "{username}", 10) ? s->username
						    : NULL;
		if (v) {
			n = strlen(v);
			t += 10;
		} else {
			v = t++;
			n = 1;
		}
		if (n > cap - o)
			return -E2BIG;
		memcpy(out + o, v, n);
		o += n;
	}
	*olen = o;
	return 0;
}

/* base64 of in[0..n) after prefix into out. Returns 0 or -E2BIG. */
static int b64_with_prefix(const char *prefix, const char *in, size_t n, char *out, size_t cap,
			   size_t *olen)
{
	size_t pl = strlen(prefix);

	if (pl + b64_enc_len(n) + 1 > cap)
		return -E2BIG;
	memcpy(out, prefix, pl);
	b64_encode((const uint8_t *)in, n, out + pl);
	*olen = pl + b64_enc_len(n);
	return 0;
}

/* The injected header's value into val: the guest's with its placeholder replaced, or the
 * filled template. tmp is scratch of the same size. */
static int injected_value(const struct cred_policy *c, const struct secret *s, const char *guest,
			  char *val, char *tmp, size_t cap, size_t *vlen, char *err, size_t errlen)
{
	size_t n = 0, dl = 0;
	int r;

	if (guest && !strncasecmp(guest, "Basic ", 6)) {
		const char *b = guest + 6;

		while (*b == ' ')
			b++;
		if (strlen(b) >= cap / 2 || b64_decode(b, strlen(b), (uint8_t *)tmp, &dl))
			return errmsg(err, errlen, -EINVAL, "%s: Basic value is not base64",
				      c->inject_header);
		if (has_placeholder(tmp, dl)) {
			r = replace_ph(tmp, dl, c->name, s->password, val, cap, &n);
			OPENSSL_cleanse(tmp, cap);
			if (r == -EACCES)
				return errmsg(err, errlen, r,
					      "%s names a credential other than \"%s\"",
					      c->inject_header, c->name);
			if (r < 0)
				return errmsg(err, errlen, r, "credential too long for the header");
			r = b64_with_prefix("Basic ", val, n, tmp, cap, vlen);
			OPENSSL_cleanse(val, cap);
			if (r)
				return errmsg(err, errlen, r, "credential too long for the header");
			memcpy(val, tmp, *vlen);
			OPENSSL_cleanse(tmp, cap);
			return 0;
		}
		OPENSSL_cleanse(tmp, cap);
	} else if (guest && has_placeholder(guest, strlen(guest))) {
		r = replace_ph(guest, strlen(guest), c->name, s->password, val, cap, vlen);
		if (r == -EACCES)
			return errmsg(err, errlen, r, "%s names a credential other than \"%s\"",
				      c->inject_header, c->name);
		if (r < 0)
			return errmsg(err, errlen, r, "credential too long for the header");
		return 0;
	}
	/* No placeholder: the policy's own template. */
	r = fill(c->inject_template, s, tmp, cap, &n);
	if (!r && !strncmp(c->inject_template, "Basic ", 6))
		r = b64_with_prefix("Basic ", tmp + 6, n - 6, val, cap, vlen);
	else if (!r) {
		memcpy(val, tmp, n);
		*vlen = n;
	}
	OPENSSL_cleanse(tmp, cap);
	if (r)
		return errmsg(err, errlen, r, "credential too long for the header");
	return 0;
}

static int host_matches(const char *value, const char *host, unsigned port)
{
	char want[300];
	int n;

	while (*value == ' ' || *value == '\t')
		value++;
	n = snprintf(want, sizeof(want), strchr(host, ':') ? "[%s]" : "%s", host);
	if (n < 0 || (size_t)n >= sizeof(want))
		return 0;
	if (!strcasecmp(value, want))
		return 1;
	if (strncasecmp(value, want, (size_t)n) || value[n] != ':')
		return 0;
	return (unsigned)strtoul(value + n + 1, NULL, 10) == port &&
	       strspn(value + n + 1, "0123456789") == strlen(value + n + 1) && value[n + 1];
}

static int host_allowed(const struct cred_policy *c, const char *host)
{
	size_t i;

	for (i = 0; i < c->hosts.n; i++)
		if (policy_host_match(c->hosts.v[i], host))
			return 1;
	return 0;
}

int inject_build_head(const struct inject_req *req, const struct cred_policy *c,
		      const struct secret *s, char **out, size_t *outlen, char *err, size_t errlen)
{
	const char *guest_inject = NULL, *host_hdr = NULL;
	char *val = NULL, *tmp = NULL, num[40];
	struct out o = {0};
	size_t i, j, vlen = 0, nhost = 0;
	int r, drop;

	*out = NULL;
	*outlen = 0;
	if (c && !s)
		c = NULL;
	if (!token_ok(req->method) || strlen(req->method) > 16)
		return errmsg(err, errlen, -EINVAL, "bad method");
	if (!strcmp(req->method, "CONNECT"))
		return errmsg(err, errlen, -EINVAL, "CONNECT inside the tunnel");
	if (!target_ok(req->target))
		return errmsg(err, errlen, -EINVAL, "request target must be a path");
	if (has_placeholder(req->target, strlen(req->target)))
		return errmsg(err, errlen, -EACCES, "credential placeholder in the URL");
	if (req->nh > INJECT_MAX_HEADERS)
		return errmsg(err, errlen, -EINVAL, "over %d headers", INJECT_MAX_HEADERS);
	for (i = 0; i < req->nh; i++) {
		const struct inject_hdr *h = &req->h[i];

		if (!token_ok(h->name) || !value_ok(h->value))
			return errmsg(err, errlen, -EINVAL, "bad header name or value");
		if (!strcasecmp(h->name, "Host")) {
			host_hdr = h->value;
			nhost++;
		}
		if (c && !strcasecmp(h->name, c->inject_header)) {
			if (guest_inject)
				return errmsg(err, errlen, -EINVAL, "%s sent twice",
					      c->inject_header);
			guest_inject = h->value;
			continue;
		}
		if (has_placeholder(h->name, strlen(h->name)) ||
		    has_placeholder(h->value, strlen(h->value)))
			return errmsg(err, errlen, -EACCES,
				      "credential placeholder outside the injected header");
	}
	if (nhost != 1 || !host_matches(host_hdr, req->host, req->port))
		return errmsg(err, errlen, -EACCES, "Host header must name %s (once)", req->host);
	if (c && !host_allowed(c, req->host))
		return errmsg(err, errlen, -EACCES, "credential \"%s\" is not for host %s", c->name,
			      req->host);

	o.cap = INJECT_HEAD_MAX - 1; /* room for the NUL */
	o.p = malloc(INJECT_HEAD_MAX);
	if (!o.p)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	if (c) {
		val = malloc(INJECT_VALUE_MAX);
		tmp = malloc(INJECT_VALUE_MAX);
		if (!val || !tmp) {
			r = errmsg(err, errlen, -ENOMEM, "out of memory");
			goto out;
		}
		r = injected_value(c, s, guest_inject, val, tmp, INJECT_VALUE_MAX, &vlen, err,
				   errlen);
		if (r)
			goto out;
	}
	puts_(&o, req->method);
	puts_(&o, " ");
	puts_(&o, req->target);
	puts_(&o, " HTTP/1.1\r\nHost: ");
	puts_(&o, host_hdr + strspn(host_hdr, " \t"));
	puts_(&o, "\r\n");
	for (i = 0; i < req->nh; i++) {
		const struct inject_hdr *h = &req->h[i];

		drop = c && !strcasecmp(h->name, c->inject_header);
		for (j = 0; j < sizeof(dropped) / sizeof(dropped[0]) && !drop; j++)
			drop = !strcasecmp(h->name, dropped[j]);
		if (drop)
			continue;
		puts_(&o, h->name);
		puts_(&o, ": ");
		puts_(&o, h->value);
		puts_(&o, "\r\n");
	}
	if (c) {
		puts_(&o, c->inject_header);
		puts_(&o, ": ");
		put(&o, val, vlen);
		puts_(&o, "\r\n");
	}
	puts_(&o, "Accept-Encoding: identity\r\nConnection: close\r\n");
	if (req->chunked) {
		puts_(&o, "Transfer-Encoding: chunked\r\n");
	} else if (req->has_length) {
		snprintf(num, sizeof(num), "Content-Length: %llu\r\n", req->content_length);
		puts_(&o, num);
	}
	puts_(&o, "\r\n");
	if (o.full) {
		r = errmsg(err, errlen, -E2BIG, "request head over %d KiB", INJECT_HEAD_MAX / 1024);
		goto out;
	}
	o.p[o.len] = '\0';
	*out = o.p;
	*outlen = o.len;
	o.p = NULL;
	r = 0;
out:
	if (o.p) {
		OPENSSL_cleanse(o.p, INJECT_HEAD_MAX);
		free(o.p);
	}
	if (val) {
		OPENSSL_cleanse(val, INJECT_VALUE_MAX);
		free(val);
	}
	if (tmp) {
		OPENSSL_cleanse(tmp, INJECT_VALUE_MAX);
		free(tmp);
	}
	return r;
}

int inject_scrubber(struct scrubber *sc, const struct cred_policy *c, const struct secret *s)
{
	return scrub_add_credential(sc, c ? c->inject_template : NULL, s->username, s->password);
}
