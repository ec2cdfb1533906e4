/*
 * libFuzzer target: what a guest program sends cove-broker's egress proxy (broker/egress_head.c):
 * the end of a request head, then its parse (CONNECT or absolute-form http://, rebuilt in origin
 * form), then the parsed host, port and method matched against a fixed egress policy; a plain
 * request's body framing over the bytes after its head (what decides where the next pipelined
 * request starts); the same bytes as an upstream's answer (where it ends), and through the
 * policy parser as a policy document.
 */
#include <stdio.h>
#include <stdlib.h>

#include "egress_head.h"
#include "egress_policy.h"
#include "fuzz.h"
#include "policy.h"

static const char fixed_policy[] =
    "{\"egress\":{\"rules\":["
    "{\"host\":\"files.example\",\"ports\":[80,8080],\"methods\":[\"GET\",\"HEAD\"]},"
    "{\"host\":\"*.svc.example\",\"ports\":[443],\"methods\":[\"CONNECT\"]},"
    "{\"host\":\"10.0.0.5\",\"ports\":[8080],\"methods\":[\"CONNECT\",\"GET\"],"
    "\"allow_private\":true}],"
    "\"max_connections\":16,\"max_bytes\":1048576,\"idle_timeout_s\":5}}";

static void one_line(const char *err)
{
	if (strchr(err, '\n') || strchr(err, '\r'))
		abort();
}

/* The bytes after a plain request's head, fed in pieces of varied sizes: never more taken than
 * given or written than the room, nothing taken once the request ended. */
static void body(const char *head, size_t hlen, const char *rest, size_t len)
{
	static char out[EGRESS_BODY_OUT(EGRESS_BODY_IN)];
	struct egress_body *b = malloc(sizeof(*b));
	size_t off = 0, step = 1;

	if (!b || egress_body_init(b, head, hlen)) {
		free(b);
		return;
	}
	while (off < len) {
		size_t n = len - off < step ? len - off : step, olen = 0;
		long used = egress_body_feed(b, rest + off, n, out, sizeof(out), &olen);

		if (used < 0)
			break;
		if ((size_t)used > n || (size_t)used > EGRESS_BODY_IN || olen > sizeof(out))
			abort();
		if (!b->done && (size_t)used != (n < EGRESS_BODY_IN ? n : EGRESS_BODY_IN))
			abort(); /* an unfinished body takes all it is given */
		off += (size_t)used;
		if (b->done) {
			if (egress_body_feed(b, rest + off, len - off, out, sizeof(out), &olen) !=
			    0)
				abort();
			break;
		}
		step = step * 3 + 1;
	}
	free(b);
}

static void answer(const char *buf, size_t len, bool head_request)
{
	struct egress_resp *r = malloc(sizeof(*r));
	size_t off = 0, step = 2;

	if (!r)
		return;
	egress_resp_init(r, head_request);
	while (off < len && !r->final) {
		size_t n = len - off < step ? len - off : step;
		long used = egress_resp_feed(r, buf + off, n);

		if (used < 0) {
			free(r);
			return;
		}
		if ((size_t)used > n || (!r->final && (size_t)used != n))
			abort();
		off += (size_t)used;
		step = step * 2 + 1;
	}
	if (!r->final)
		egress_resp_feed(r, NULL, 0);
	else if (egress_resp_feed(r, buf, len) != 0)
		abort(); /* nothing after the final answer belongs to it */
	free(r);
}

static void head(const struct policy *pol, const char *buf, size_t len)
{
	struct egress_head h;
	char err[256] = "", why[256] = "";
	long end = egress_head_end(buf, len);

	if (end == -E2BIG) {
		if (len < EGRESS_HEAD_MAX)
			abort(); /* too big before the cap */
		return;
	}
	if (end < 0 || (size_t)end > len)
		abort();
	if (end == 0)
		return;
	memset(&h, 0, sizeof(h));
	int r = egress_head_parse(buf, (size_t)end, &h, err, sizeof(err));
	one_line(err);
	if (r == 0) {
		if (!h.method[0] || !h.host[0] || h.port < 1 || h.port > 65535)
			abort();
		for (const char *c = h.host; *c; c++)
			if (*c >= 'A' && *c <= 'Z')
				abort(); /* hosts are matched lower case */
		if (h.is_connect != (h.fwd == NULL))
			abort();
		if (h.fwd) {
			/* What goes upstream: NUL-terminated at fwd_len, one head that ends once.
			 */
			if (strlen(h.fwd) != h.fwd_len || h.fwd_len < 4 ||
			    strcmp(h.fwd + h.fwd_len - 4, "\r\n\r\n") ||
			    strstr(h.fwd, "\r\n\r\n") != h.fwd + h.fwd_len - 4)
				abort();
		}
		if (!h.is_connect)
			body(buf, (size_t)end, buf + end, len - (size_t)end);
		int k = egress_match(&pol->egress, h.host, h.port, h.method, why, sizeof(why));
		if (k < -1 || k >= (int)pol->egress.nrules)
			abort();
		if (k < 0)
			one_line(why);
	}
	egress_head_free(&h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct policy pol;
	static int loaded;
	char err[256] = "";

	if (!loaded) {
		if (policy_parse(fixed_policy, sizeof(fixed_policy) - 1, &pol, err, sizeof(err))) {
			fprintf(stderr, "fuzz_egress: fixed policy: %s\n", err);
			abort();
		}
		loaded = 1;
	}
	head(&pol, (const char *)data, size);
	answer((const char *)data, size, size && (data[0] & 1));

	struct policy p;
	memset(&p, 0, sizeof(p));
	err[0] = '\0';
	if (policy_parse((const char *)data, size, &p, err, sizeof(err)) == 0)
		policy_free(&p);
	else
		one_line(err);
	return 0;
}
