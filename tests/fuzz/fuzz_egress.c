/*
 * libFuzzer target: what a guest program sends cove-broker's egress proxy (broker/egress_head.c):
 * the end of a request head, then its parse (CONNECT or absolute-form http://, rebuilt in origin
 * form), then the parsed host, port and method matched against a fixed egress policy; the same
 * bytes also go through the policy parser as a policy document.
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
			/* What goes upstream: NUL-terminated at fwd_len, one head that ends once. */
			if (strlen(h.fwd) != h.fwd_len || h.fwd_len < 4 ||
			    strcmp(h.fwd + h.fwd_len - 4, "\r\n\r\n") ||
			    strstr(h.fwd, "\r\n\r\n") != h.fwd + h.fwd_len - 4)
				abort();
		}
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

	struct policy p;
	memset(&p, 0, sizeof(p));
	err[0] = '\0';
	if (policy_parse((const char *)data, size, &p, err, sizeof(err)) == 0)
		policy_free(&p);
	else
		one_line(err);
	return 0;
}
