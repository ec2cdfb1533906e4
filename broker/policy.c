/* Policy file parsing (jansson) and request matching: scheme, host, port, path, method, TTL,
 * max uses and a sliding one-minute rate window. */
#include "policy.h"
#include "common/errmsg.h"
#include "common/fd_io.h"
#include "common/hex.h"
#include "common/term_safe.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define NS_PER_S 1000000000LL

static void strlist_free(struct strlist *l)
{
	size_t i;

	for (i = 0; i < l->n; i++)
		free(l->v[i]);
	free(l->v);
	l->v = NULL;
	l->n = 0;
}

static int strlist_add(struct strlist *l, const char *s)
{
	char **v = realloc(l->v, (l->n + 1) * sizeof(*v));

	if (!v)
		return -ENOMEM;
	l->v = v;
	l->v[l->n] = strdup(s);
	if (!l->v[l->n])
		return -ENOMEM;
	l->n++;
	return 0;
}

static bool has_ctl(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			return true;
	return false;
}

static bool is_token(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (!isalnum((unsigned char)*s) && !strchr("!#$%&'*+-.^_`|~", *s))
			return false;
	return true;
}

/* Array of non-empty strings without control bytes, 1..POLICY_MAX_LIST long. */
static int parse_strarray(json_t *a, const char *what, const char *cred, struct strlist *out,
			  char *err, size_t errlen)
{
	size_t i;
	json_t *v;

	if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > POLICY_MAX_LIST)
		return errmsg(err, errlen, -EINVAL,
			      "credential \"%s\": %s must be an array of 1..%d strings", cred, what,
			      POLICY_MAX_LIST);
	json_array_foreach(a, i, v)
	{
		const char *s = json_string_value(v);

		if (!s || !*s || has_ctl(s) || strlen(s) > 1024)
			return errmsg(
			    err, errlen, -EINVAL,
			    "credential \"%s\": %s[%zu] must be a non-empty string without "
			    "control bytes",
			    cred, what, i);
		if (strlist_add(out, s))
			return errmsg(err, errlen, -ENOMEM, "out of memory");
	}
	return 0;
}

/* Header names no policy may allow: they change where or how the request goes, or what the
 * server takes as method, path or client ("X-Forwarded-" and "Proxy-" are prefixes). */
static const char *const never_headers[] = {"Host",
					    "Content-Length",
					    "Transfer-Encoding",
					    "Connection",
					    "Expect",
					    "Accept-Encoding",
					    "TE",
					    "Trailer",
					    "Upgrade",
					    "Keep-Alive",
					    "Proxy-",
					    "Forwarded",
					    "X-Forwarded-",
					    "X-Real-IP",
					    "X-HTTP-Method-Override",
					    "X-HTTP-Method",
					    "X-Method-Override",
					    "X-Original-URL",
					    "X-Rewrite-URL",
					    "X-Original-Method",
					    NULL};

/* What a credential allows when its policy names no headers. */
static const char *const default_headers[] = {"Accept",	    "Accept-Language", "Content-Type",
					      "User-Agent", "If-None-Match",   "If-Modified-Since",
					      NULL};

/* Compares the header name that starts line (ended by ':' or NUL) with name. */
static bool header_name_eq(const char *line, size_t len, const char *name)
{
	return strlen(name) == len && !strncasecmp(line, name, len);
}

static bool header_never(const char *name, size_t len)
{
	size_t i, n;

	for (i = 0; never_headers[i]; i++) {
		n = strlen(never_headers[i]);
		if (never_headers[i][n - 1] == '-'
			? len >= n && !strncasecmp(name, never_headers[i], n)
			: header_name_eq(name, len, never_headers[i]))
			return true;
	}
	return false;
}

bool policy_header_allowed(const struct cred_policy *c, const char *line)
{
	size_t i, len = strcspn(line, ":");

	if (header_never(line, len) ||
	    (c->inject_header && header_name_eq(line, len, c->inject_header)))
		return false;
	for (i = 0; i < c->headers.n; i++)
		if (header_name_eq(line, len, c->headers.v[i]))
			return true;
	return false;
}

static int parse_allow(json_t *o, struct cred_policy *c, char *err, size_t errlen)
{
	const char *k;
	json_t *v;
	size_t i;
	int r;

	if (!json_is_object(o))
		return errmsg(err, errlen, -EINVAL, "credential \"%s\": allow must be an object",
			      c->name);
	json_object_foreach(o, k, v)
	{
		if (!strcmp(k, "schemes")) {
			r = parse_strarray(v, "allow.schemes", c->name, &c->schemes, err, errlen);
			if (r)
				return r;
			for (i = 0; i < c->schemes.n; i++)
				if (strcmp(c->schemes.v[i], "http") &&
				    strcmp(c->schemes.v[i], "https"))
					return errmsg(
					    err, errlen, -EINVAL,
					    "credential \"%s\": allow.schemes: only \"http\" "
					    "and \"https\"",
					    c->name);
		} else if (!strcmp(k, "hosts")) {
			r = parse_strarray(v, "allow.hosts", c->name, &c->hosts, err, errlen);
			if (r)
				return r;
			for (i = 0; i < c->hosts.n; i++) {
				const char *h = c->hosts.v[i];

				if (strchr(h + (h[0] == '*'), '*') ||
				    (h[0] == '*' && (h[1] != '.' || !h[2])) || strchr(h, '/') ||
				    strchr(h, ':') == h)
					return errmsg(
					    err, errlen, -EINVAL,
					    "credential \"%s\": allow.hosts[%zu] must be a "
					    "host or \"*.suffix\"",
					    c->name, i);
			}
		} else if (!strcmp(k, "ports")) {
			if (!json_is_array(v) || json_array_size(v) == 0 ||
			    json_array_size(v) > POLICY_MAX_LIST)
				return errmsg(err, errlen, -EINVAL,
					      "credential \"%s\": allow.ports must be an array of "
					      "1..%d integers",
					      c->name, POLICY_MAX_LIST);
			for (i = 0; i < json_array_size(v); i++) {
				json_t *p = json_array_get(v, i);

				if (!json_is_integer(p) || json_integer_value(p) < 1 ||
				    json_integer_value(p) > 65535)
					return errmsg(
					    err, errlen, -EINVAL,
					    "credential \"%s\": allow.ports[%zu] must be an "
					    "integer 1..65535",
					    c->name, i);
				c->ports[c->nports++] = (int)json_integer_value(p);
			}
		} else if (!strcmp(k, "path_prefixes")) {
			r = parse_strarray(v, "allow.path_prefixes", c->name, &c->path_prefixes,
					   err, errlen);
			if (r)
				return r;
		} else if (!strcmp(k, "headers")) {
			r = parse_strarray(v, "allow.headers", c->name, &c->headers, err, errlen);
			if (r)
				return r;
			for (i = 0; i < c->headers.n; i++)
				if (!is_token(c->headers.v[i]) ||
				    header_never(c->headers.v[i], strlen(c->headers.v[i])))
					return errmsg(err, errlen, -EINVAL,
						      "credential \"%s\": allow.headers[%zu]: "
						      "\"%s\" is not a "
						      "header name the guest may set",
						      c->name, i, c->headers.v[i]);
		} else if (!strcmp(k, "path_params")) {
			if (!json_is_boolean(v))
				return errmsg(
				    err, errlen, -EINVAL,
				    "credential \"%s\": allow.path_params must be true or false",
				    c->name);
			c->path_params = json_is_true(v);
		} else if (!strcmp(k, "methods")) {
			r = parse_strarray(v, "allow.methods", c->name, &c->methods, err, errlen);
			if (r)
				return r;
			for (i = 0; i < c->methods.n; i++)
				if (!is_token(c->methods.v[i]))
					return errmsg(
					    err, errlen, -EINVAL,
					    "credential \"%s\": allow.methods[%zu] is not a "
					    "method",
					    c->name, i);
		} else {
			return errmsg(err, errlen, -EINVAL,
				      "credential \"%s\": unknown key allow.%s", c->name, k);
		}
	}
	if (!c->hosts.n)
		return errmsg(err, errlen, -EINVAL, "credential \"%s\": allow.hosts is required",
			      c->name);
	if (!c->schemes.n && strlist_add(&c->schemes, "https"))
		return -ENOMEM;
	if (!c->path_prefixes.n && strlist_add(&c->path_prefixes, "/"))
		return -ENOMEM;
	/* Prefixes are kept in canonical form, the form policy_check compares paths in. */
	for (i = 0; i < c->path_prefixes.n; i++) {
		char *p = c->path_prefixes.v[i], canon[1025];
		const char *why = NULL;

		if (p[0] != '/')
			return errmsg(err, errlen, -EINVAL,
				      "credential \"%s\": allow.path_prefixes[%zu] must start "
				      "with '/'",
				      c->name, i);
		if (policy_path_canon(p, c->path_params, canon, sizeof(canon), &why))
			return errmsg(err, errlen, -EINVAL,
				      "credential \"%s\": allow.path_prefixes[%zu]: %s", c->name, i,
				      why);
		strcpy(p, canon); /* never longer than the original */
	}
	if (!c->headers.n)
		for (i = 0; default_headers[i]; i++)
			if (strlist_add(&c->headers, default_headers[i]))
				return -ENOMEM;
	if (!c->methods.n && strlist_add(&c->methods, "GET"))
		return -ENOMEM;
	return 0;
}

static int parse_inject(json_t *o, struct cred_policy *c, char *err, size_t errlen)
{
	const char *k, *t;
	json_t *v;

	if (!json_is_object(o))
		return errmsg(err, errlen, -EINVAL, "credential \"%s\": inject must be an object",
			      c->name);
	json_object_foreach(o, k, v)
	{
		const char *s = json_string_value(v);

		if (strcmp(k, "header") && strcmp(k, "template"))
			return errmsg(err, errlen, -EINVAL,
				      "credential \"%s\": unknown key inject.%s", c->name, k);
		if (!s || has_ctl(s) || strlen(s) > 1024)
			return errmsg(
			    err, errlen, -EINVAL,
			    "credential \"%s\": inject.%s must be a string without control "
			    "bytes",
			    c->name, k);
		if (!strcmp(k, "header")) {
			if (!is_token(s))
				return errmsg(
				    err, errlen, -EINVAL,
				    "credential \"%s\": inject.header is not a header name",
				    c->name);
			c->inject_header = strdup(s);
		} else {
			c->inject_template = strdup(s);
		}
	}
	if (!c->inject_header || !c->inject_template)
		return errmsg(err, errlen, -EINVAL,
			      "credential \"%s\": inject needs \"header\" and \"template\"",
			      c->name);
	/* Only {password} and {username} may appear in braces. */
	for (t = strchr(c->inject_template, '{'); t; t = strchr(t + 1, '{'))
		if (strncmp(t, "{password}", 10) && strncmp(t, "{username}", 10))
			return errmsg(err, errlen, -EINVAL,
				      "credential \"%s\": inject.template: only {password} and "
				      "{username} placeholders",
				      c->name);
	if (!strstr(c->inject_template, "{password}") && !strstr(c->inject_template, "{username}"))
		return errmsg(err, errlen, -EINVAL,
			      "credential \"%s\": inject.template uses neither {password} nor "
			      "{username}",
			      c->name);
	return 0;
}

static int parse_int(json_t *v, const char *k, const char *cred, int64_t max, int64_t *out,
		     char *err, size_t errlen)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > max)
		return errmsg(err, errlen, -EINVAL,
			      "credential \"%s\": %s must be an integer 0..%lld", cred, k,
			      (long long)max);
	*out = json_integer_value(v);
	return 0;
}

static int parse_cred(const char *name, json_t *o, struct cred_policy *c, char *err, size_t errlen)
{
	const char *k;
	json_t *v;
	int64_t n;
	int r;

	c->name = strdup(name);
	if (!c->name)
		return -ENOMEM;
	if (!*name || has_ctl(name) || strlen(name) > 128)
		return errmsg(err, errlen, -EINVAL,
			      "credential name must be 1..128 printable bytes");
	if (!json_is_object(o))
		return errmsg(err, errlen, -EINVAL, "credential \"%s\" must be an object", name);
	json_object_foreach(o, k, v)
	{
		if (!strcmp(k, "helper")) {
			r = parse_strarray(v, "helper", name, &c->helper, err, errlen);
		} else if (!strcmp(k, "helper_input")) {
			const char *ik;
			json_t *iv;

			if (!json_is_object(v))
				return errmsg(
				    err, errlen, -EINVAL,
				    "credential \"%s\": helper_input must be an object of "
				    "strings",
				    name);
			r = 0;
			json_object_foreach(v, ik, iv)
			{
				const char *s = json_string_value(iv);

				if (!s || has_ctl(s) || has_ctl(ik) || !*ik || strchr(ik, '=') ||
				    strlen(s) > 1024 || strlen(ik) > 64)
					return errmsg(
					    err, errlen, -EINVAL,
					    "credential \"%s\": helper_input.%s must be a "
					    "single-line string",
					    name, ik);
				if (strlist_add(&c->input_keys, ik) ||
				    strlist_add(&c->input_vals, s))
					return -ENOMEM;
			}
		} else if (!strcmp(k, "inject")) {
			r = parse_inject(v, c, err, errlen);
		} else if (!strcmp(k, "allow")) {
			r = parse_allow(v, c, err, errlen);
		} else if (!strcmp(k, "ttl_s")) {
			r = parse_int(v, k, name, 10LL * 365 * 86400, &c->ttl_s, err, errlen);
		} else if (!strcmp(k, "rate_per_min")) {
			r = parse_int(v, k, name, 100000, &n, err, errlen);
			c->rate_per_min = (uint32_t)n;
		} else if (!strcmp(k, "max_uses")) {
			r = parse_int(v, k, name, INT64_MAX, &n, err, errlen);
			c->max_uses = (uint64_t)n;
		} else if (!strcmp(k, "ca_file")) {
			const char *f = json_string_value(v);

			if (!f || !*f || has_ctl(f) || access(f, R_OK))
				return errmsg(
				    err, errlen, -EINVAL,
				    "credential \"%s\": ca_file must name a readable file", name);
			c->ca_file = strdup(f);
			if (!c->ca_file)
				return -ENOMEM;
			r = 0;
		} else if (!strcmp(k, "allow_private")) {
			if (!json_is_boolean(v))
				return errmsg(
				    err, errlen, -EINVAL,
				    "credential \"%s\": allow_private must be true or false", name);
			c->allow_private = json_is_true(v);
			r = 0;
		} else {
			return errmsg(err, errlen, -EINVAL, "credential \"%s\": unknown key \"%s\"",
				      name, k);
		}
		if (r)
			return r;
	}
	if (!c->helper.n)
		return errmsg(err, errlen, -EINVAL, "credential \"%s\": helper is required", name);
	if (!c->inject_header)
		return errmsg(err, errlen, -EINVAL, "credential \"%s\": inject is required", name);
	if (!c->hosts.n)
		return errmsg(err, errlen, -EINVAL, "credential \"%s\": allow is required", name);
	for (size_t i = 0; i < c->headers.n; i++)
		if (!strcasecmp(c->headers.v[i], c->inject_header))
			return errmsg(err, errlen, -EINVAL,
				      "credential \"%s\": allow.headers names the inject header",
				      name);
	if (c->rate_per_min) {
		c->rate_ring = calloc(c->rate_per_min, sizeof(*c->rate_ring));
		if (!c->rate_ring)
			return -ENOMEM;
	}
	return 0;
}

static int parse_doc(const char *text, size_t len, struct policy *out, char *err, size_t errlen);

int policy_parse(const char *text, size_t len, struct policy *out, char *err, size_t errlen)
{
	int r = parse_doc(text, len, out, err, errlen);
	/* Errors quote keys and names from the file: made terminal-safe, so one line. */
	if (r && err && errlen) {
		char raw[1024];
		snprintf(raw, sizeof(raw), "%s", err);
		term_safe(raw, err, errlen);
	}
	return r;
}

static int parse_doc(const char *text, size_t len, struct policy *out, char *err, size_t errlen)
{
	json_error_t jerr;
	json_t *root, *creds = NULL, *v;
	const char *k;
	bool has_egress = false;
	int r = 0;

	memset(out, 0, sizeof(*out));
	root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return errmsg(err, errlen, -EINVAL, "policy: line %d: %s", jerr.line, jerr.text);
	if (!json_is_object(root)) {
		r = errmsg(err, errlen, -EINVAL, "policy: top level must be an object");
		goto out;
	}
	egress_policy_init(&out->egress);
	json_object_foreach(root, k, v)
	{
		if (!strcmp(k, "egress")) {
			r = egress_policy_parse(v, &out->egress, err, errlen);
			if (r)
				goto out;
			has_egress = true;
			continue;
		}
		if (strcmp(k, "credentials")) {
			r = errmsg(err, errlen, -EINVAL, "policy: unknown key \"%s\"", k);
			goto out;
		}
		creds = v;
	}
	/* A policy for egress alone needs no credential. */
	if (!creds && has_egress)
		goto out;
	if (!json_is_object(creds) || json_object_size(creds) == 0 ||
	    json_object_size(creds) > POLICY_MAX_CREDS) {
		r = errmsg(err, errlen, -EINVAL,
			   "policy: \"credentials\" must be an object with 1..%d entries",
			   POLICY_MAX_CREDS);
		goto out;
	}
	out->creds = calloc(json_object_size(creds), sizeof(*out->creds));
	if (!out->creds) {
		r = -ENOMEM;
		goto out;
	}
	json_object_foreach(creds, k, v)
	{
		r = parse_cred(k, v, &out->creds[out->ncreds++], err, errlen);
		if (r)
			goto out;
	}
out:
	json_decref(root);
	if (r)
		policy_free(out);
	return r;
}

int policy_load(const char *path, struct policy *out, char *err, size_t errlen)
{
	struct stat st;
	char *buf;
	ssize_t got;
	int fd, r;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errmsg(err, errlen, -errno, "policy %s: %s", path, strerror(errno));
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size > POLICY_FILE_MAX) {
		close(fd);
		return errmsg(err, errlen, -EINVAL, "policy %s: not a regular file under 1 MiB",
			      path);
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	got = read_upto(fd, buf, (size_t)st.st_size);
	close(fd);
	r = policy_parse(buf, got > 0 ? (size_t)got : 0, out, err, errlen);
	free(buf);
	return r;
}

void policy_free(struct policy *p)
{
	size_t i;

	for (i = 0; i < p->ncreds; i++) {
		struct cred_policy *c = &p->creds[i];

		free(c->name);
		strlist_free(&c->helper);
		strlist_free(&c->input_keys);
		strlist_free(&c->input_vals);
		free(c->inject_header);
		free(c->inject_template);
		strlist_free(&c->schemes);
		strlist_free(&c->hosts);
		strlist_free(&c->path_prefixes);
		strlist_free(&c->methods);
		strlist_free(&c->headers);
		free(c->rate_ring);
		free(c->ca_file);
	}
	free(p->creds);
	egress_policy_free(&p->egress);
	memset(p, 0, sizeof(*p));
	egress_policy_init(&p->egress);
}

struct cred_policy *policy_find(struct policy *p, const char *name)
{
	size_t i;

	for (i = 0; i < p->ncreds; i++)
		if (!strcmp(p->creds[i].name, name))
			return &p->creds[i];
	return NULL;
}

bool policy_host_match(const char *pattern, const char *host)
{
	size_t pl, hl;

	if (pattern[0] != '*')
		return !strcasecmp(pattern, host);
	/* "*.example.com" matches "a.example.com" and "a.b.example.com", not "example.com". */
	pl = strlen(pattern + 1);
	hl = strlen(host);
	return hl > pl && !strcasecmp(host + hl - pl, pattern + 1);
}

static bool list_has(const struct strlist *l, const char *s)
{
	size_t i;

	for (i = 0; i < l->n; i++)
		if (!strcmp(l->v[i], s))
			return true;
	return false;
}

/* A strict UTF-8 reader fed one byte at a time: no overlong forms (a "%c0%ae" that a lenient
 * server decodes to '.'), no surrogates, nothing past U+10FFFF, no stray continuation bytes. */
struct utf8_state {
	uint32_t cp, min;
	unsigned need;
};

static bool utf8_step(struct utf8_state *u, unsigned c)
{
	if (u->need) {
		if ((c & 0xc0) != 0x80)
			return false;
		u->cp = u->cp << 6 | (c & 0x3f);
		if (--u->need)
			return true;
		return u->cp >= u->min && u->cp <= 0x10ffff && (u->cp < 0xd800 || u->cp > 0xdfff);
	}
	if (c < 0x80)
		return true;
	if (c >= 0xc2 && c <= 0xdf)
		*u = (struct utf8_state){.cp = c & 0x1f, .min = 0x80, .need = 1};
	else if (c >= 0xe0 && c <= 0xef)
		*u = (struct utf8_state){.cp = c & 0x0f, .min = 0x800, .need = 2};
	else if (c >= 0xf0 && c <= 0xf4)
		*u = (struct utf8_state){.cp = c & 0x07, .min = 0x10000, .need = 3};
	else
		return false; /* 0x80-0xc1 (stray or overlong lead), 0xf5-0xff */
	return true;
}

int policy_path_canon(const char *path, bool allow_params, char *out, size_t cap, const char **why)
{
	const char *p = path;
	struct utf8_state u8 = {0};
	size_t o = 0;

	if (*p != '/') {
		*why = "path does not start with '/'";
		return -EINVAL;
	}
	while (*p == '/') {
		size_t seg = o + 1;
		bool in_param = false;

		if (o + 1 >= cap)
			goto toolong;
		out[o++] = '/';
		for (p++; *p && *p != '/'; p++) {
			int c = (unsigned char)*p;

			if (c == ';') {
				if (u8.need) {
					*why = "path is not valid UTF-8";
					return -EINVAL;
				}
				if (!allow_params) {
					*why = "path has ';' parameters";
					return -EINVAL;
				}
				in_param = true;
				continue;
			}
			if (c == '%') {
				int hi = hex_digit(p[1]), lo = hi < 0 ? -1 : hex_digit(p[2]);

				if (lo < 0) {
					*why = "path has a bad '%' escape";
					return -EINVAL;
				}
				c = hi << 4 | lo;
				p += 2;
				/* A decoded separator, escape or parameter is read differently
				 * by servers that decode once more or split after decoding. */
				if (c == '/' || c == '\\' || c == '%' || c == ';') {
					*why = "path has an encoded '/', '\\', '%' or ';'";
					return -EINVAL;
				}
			}
			if (c < 0x20 || c == 0x7f || c == '\\') {
				*why = "path has a control byte or '\\'";
				return -EINVAL;
			}
			/* Raw and decoded bytes alike, in one sequence: "%c0" then a raw byte
			 * is read as one character too. */
			if (!utf8_step(&u8, (unsigned)c)) {
				*why = "path is not valid UTF-8";
				return -EINVAL;
			}
			if (in_param)
				continue;
			if (o + 1 >= cap)
				goto toolong;
			out[o++] = (char)c;
		}
		if (u8.need) { /* a character cut by '/' or the end */
			*why = "path is not valid UTF-8";
			return -EINVAL;
		}
		/* Dot segments in any spelling ("..;x", "%2e%2e") that survived curl's
		 * normalisation could climb out of the prefix on the server. */
		if ((o - seg == 1 && out[seg] == '.') ||
		    (o - seg == 2 && out[seg] == '.' && out[seg + 1] == '.')) {
			*why = "path has a dot segment";
			return -EINVAL;
		}
	}
	if (*p) {
		*why = "path does not start with '/'";
		return -EINVAL;
	}
	out[o] = '\0';
	return 0;
toolong:
	*why = "path too long";
	return -EINVAL;
}

/* Whole segments: "/v1" allows "/v1" and "/v1/x" but not "/v1beta"; "/v1/" needs "/v1/...". */
static bool path_allowed(const struct strlist *l, const char *canon)
{
	size_t i, n;

	for (i = 0; i < l->n; i++) {
		n = strlen(l->v[i]);
		if (strncmp(canon, l->v[i], n))
			continue;
		if (l->v[i][n - 1] == '/' || canon[n] == '\0' || canon[n] == '/')
			return true;
	}
	return false;
}

static int default_port(const char *scheme)
{
	return strcmp(scheme, "https") ? 80 : 443;
}

const char *policy_check(const struct cred_policy *c, const struct url_parts *u, const char *method,
			 int64_t now_ns, int64_t start_ns)
{
	char canon[URL_MAX + 1];
	const char *why;
	size_t i;
	bool ok;

	if (c->ttl_s && now_ns - start_ns >= c->ttl_s * NS_PER_S)
		return "expired";
	if (!list_has(&c->schemes, u->scheme))
		return "scheme not allowed";
	for (ok = false, i = 0; i < c->hosts.n && !ok; i++)
		ok = policy_host_match(c->hosts.v[i], u->host);
	if (!ok)
		return "host not allowed";
	if (c->nports) {
		for (ok = false, i = 0; i < c->nports && !ok; i++)
			ok = c->ports[i] == u->port;
	} else {
		ok = u->port == default_port(u->scheme);
	}
	if (!ok)
		return "port not allowed";
	if (policy_path_canon(u->path, c->path_params, canon, sizeof(canon), &why))
		return why;
	if (!path_allowed(&c->path_prefixes, canon))
		return "path not allowed";
	if (!list_has(&c->methods, method))
		return "method not allowed";
	if (c->max_uses && c->uses >= c->max_uses)
		return "max uses";
	if (c->rate_per_min && c->rate_count == c->rate_per_min &&
	    now_ns - c->rate_ring[c->rate_head] < 60 * NS_PER_S)
		return "over rate";
	return NULL;
}

void policy_consume(struct cred_policy *c, int64_t now_ns)
{
	c->uses++;
	if (!c->rate_per_min)
		return;
	/* Ring of the last rate_per_min use times; rate_head is the oldest once full. */
	if (c->rate_count < c->rate_per_min) {
		c->rate_ring[(c->rate_head + c->rate_count) % c->rate_per_min] = now_ns;
		c->rate_count++;
	} else {
		c->rate_ring[c->rate_head] = now_ns;
		c->rate_head = (c->rate_head + 1) % c->rate_per_min;
	}
}
