/* Guest request validation: JSON shape, types, sizes, header syntax and the body encoding. */
#include "request.h"
#include "common/base64.h"
#include "common/errmsg.h"
#include "common/hex.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* "Name: value": a token name, a colon, printable value without CR/LF. */
static int header_valid(const char *h)
{
	const char *c = h;

	while (*c && *c != ':') {
		if (!isalnum((unsigned char)*c) && !strchr("!#$%&'*+-.^_`|~", *c))
			return 0;
		c++;
	}
	if (c == h || *c != ':')
		return 0;
	for (; *c; c++)
		if (((unsigned char)*c < 0x20 && *c != '\t') || *c == 0x7f)
			return 0;
	return 1;
}

static const char *opt_string(json_t *o, const char *k, int *bad)
{
	json_t *v = json_object_get(o, k);

	if (!v)
		return NULL;
	if (!json_is_string(v)) {
		*bad = 1;
		return NULL;
	}
	return json_string_value(v);
}

int breq_parse(const uint8_t *msg, size_t len, struct breq *out, char *err, size_t errlen)
{
	json_error_t jerr;
	json_t *v, *h;
	const char *tok, *b64;
	size_t i, bl;
	int bad = 0;

	memset(out, 0, sizeof(*out));
	out->credential = "";
	out->method = "";
	out->url = "";
	out->root = json_loadb((const char *)msg, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!out->root)
		return errmsg(err, errlen, -EINVAL, "bad json");
	if (!json_is_object(out->root))
		return errmsg(err, errlen, -EINVAL, "not a json object");
	/* Pick up what names the request first, so even a bad request is audited by name. */
	out->credential = opt_string(out->root, "credential", &bad);
	out->method = opt_string(out->root, "method", &bad);
	out->url = opt_string(out->root, "url", &bad);
	if (bad) {
		out->credential = out->method = out->url = "";
		return errmsg(err, errlen, -EINVAL, "credential, method and url must be strings");
	}
	if (!out->credential)
		out->credential = "default";
	if (!out->method)
		out->method = "GET";
	if (!out->url) {
		out->url = "";
		return errmsg(err, errlen, -EINVAL, "url missing");
	}
	v = json_object_get(out->root, "v");
	if (!json_is_integer(v) || json_integer_value(v) != 1)
		return errmsg(err, errlen, -EINVAL, "v must be 1");
	/* A missing epoch/token (an agent that has had no identity yet) is a stale epoch. */
	v = json_object_get(out->root, "epoch");
	if (json_is_null(v))
		v = NULL;
	if (v && (!json_is_integer(v) || json_integer_value(v) < 0))
		return errmsg(err, errlen, -EINVAL, "epoch must be a non-negative integer");
	out->epoch = v ? (uint64_t)json_integer_value(v) : 0;
	tok = json_is_null(json_object_get(out->root, "token"))
		  ? NULL
		  : opt_string(out->root, "token", &bad);
	if (bad)
		return errmsg(err, errlen, -EINVAL, "token must be a string");
	out->has_token = v && tok && hex_decode(tok, out->token, REQ_TOKEN_BYTES) == 0;
	if (!*out->credential || strlen(out->credential) > 128)
		return errmsg(err, errlen, -EINVAL, "credential empty or too long");
	if (!*out->method || strlen(out->method) > 16)
		return errmsg(err, errlen, -EINVAL, "method empty or too long");
	for (i = 0; out->method[i]; i++)
		if (!isupper((unsigned char)out->method[i]))
			return errmsg(err, errlen, -EINVAL, "method must be upper-case letters");
	h = json_object_get(out->root, "headers");
	if (h) {
		if (!json_is_array(h) || json_array_size(h) > REQ_MAX_HEADERS)
			return errmsg(err, errlen, -EINVAL,
				      "headers must be an array of at most %d", REQ_MAX_HEADERS);
		json_array_foreach(h, i, v)
		{
			const char *s = json_string_value(v);

			if (!s || json_string_length(v) != strlen(s) ||
			    strlen(s) > REQ_HEADER_MAX || !header_valid(s))
				return errmsg(err, errlen, -EINVAL,
					      "headers[%zu] is not \"Name: value\"", i);
			out->headers[out->nheaders++] = s;
		}
	}
	b64 = opt_string(out->root, "body_b64", &bad);
	if (bad)
		return errmsg(err, errlen, -EINVAL, "body_b64 must be a string");
	if (b64) {
		bl = strlen(b64);
		if (bl > b64_enc_len(REQ_BODY_MAX))
			return errmsg(err, errlen, -EINVAL, "body over %d KiB",
				      REQ_BODY_MAX / 1024);
		out->body = malloc(bl / 4 * 3 + 1);
		if (!out->body)
			return errmsg(err, errlen, -ENOMEM, "out of memory");
		if (b64_decode(b64, bl, out->body, &out->body_len))
			return errmsg(err, errlen, -EINVAL, "body_b64 is not base64");
	}
	return 0;
}

void breq_free(struct breq *r)
{
	free(r->body);
	json_decref(r->root);
	memset(r, 0, sizeof(*r));
}
