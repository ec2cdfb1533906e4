/*
 * libFuzzer target: cove-broker's parsers of guest and file input (broker/): message framing
 * (frame.c), request messages (request.c), URLs (url.c, libcurl's parser) and the policy file
 * and its checks (policy.c), and the scrubber (scrub.c) over an answer. Every input goes through
 * all of them: the framing, then the payload as a request checked against a fixed policy, then
 * the bytes as a policy document, a path and an upstream's answer to scrub.
 */
#include <stdio.h>
#include <stdlib.h>

#include "frame.h"
#include "fuzz.h"
#include "policy.h"
#include "request.h"
#include "scrub.h"
#include "url.h"

static const char fixed_policy[] =
    "{\"credentials\":{"
    "\"default\":{\"helper\":[\"/bin/helper\",\"x\"],"
    "\"helper_input\":{\"protocol\":\"https\",\"host\":\"api.example.com\"},"
    "\"inject\":{\"header\":\"Authorization\",\"template\":\"Bearer {password}\"},"
    "\"allow\":{\"schemes\":[\"http\",\"https\"],"
    "\"hosts\":[\"127.0.0.1\",\"api.example.com\",\"*.svc.example\"],"
    "\"ports\":[8080,443],\"path_prefixes\":[\"/v1/\",\"/health\"],"
    "\"methods\":[\"GET\",\"POST\"],\"headers\":[\"Accept\",\"X-Trace\"]},"
    "\"ttl_s\":60,\"rate_per_min\":3,\"max_uses\":5,\"allow_private\":false},"
    "\"params\":{\"helper\":[\"h\"],\"inject\":{\"header\":\"X-Key\",\"template\":\"{username}\"},"
    "\"allow\":{\"hosts\":[\"example.org\"],\"path_params\":true}}}}";

static void one_line(const char *err)
{
	if (strchr(err, '\n'))
		abort();
}

/* A request as the broker serves one: parse, split its URL, ask the policy. */
static void request(struct policy *pol, const uint8_t *msg, size_t len)
{
	struct breq q;
	char err[256] = "";
	memset(&q, 0, sizeof(q));
	int r = breq_parse(msg, len, &q, err, sizeof(err));
	one_line(err);
	if (r == 0) {
		if (q.nheaders > REQ_MAX_HEADERS || q.body_len > REQ_BODY_MAX || !q.method ||
		    !q.url)
			abort();
		struct cred_policy *c = policy_find(pol, q.credential);
		struct url_parts u;
		memset(&u, 0, sizeof(u));
		err[0] = '\0';
		if (url_split(q.url, &u, err, sizeof(err)) == 0) {
			if (!u.scheme || !u.host || !u.path || u.path[0] != '/')
				abort();
			if (c) {
				(void)policy_check(c, &u, q.method, 2, 1);
				char canon[URL_MAX];
				const char *why = NULL;
				(void)policy_path_canon(u.path, c->path_params, canon,
							sizeof(canon), &why);
			}
			url_parts_free(&u);
		} else {
			one_line(err);
		}
		for (size_t i = 0; c && i < q.nheaders; i++)
			(void)policy_header_allowed(c, q.headers[i]);
	}
	breq_free(&q);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct policy pol;
	static bool have_pol;
	char err[256] = "";
	if (!have_pol) {
		if (policy_parse(fixed_policy, strlen(fixed_policy), &pol, err, sizeof(err))) {
			fprintf(stderr, "fuzz_broker: fixed policy: %s\n", err);
			abort();
		}
		have_pol = true;
	}
	/* Framing: a frame's payload is a request; unframed input is tried as one too. */
	size_t plen = 0;
	int f = frame_peek(data, size, &plen);
	if (f == 1) {
		if (plen > FRAME_MAX || plen > size - FRAME_HDR)
			abort();
		request(&pol, data + FRAME_HDR, plen);
	} else if (f != 0 && f != -EMSGSIZE) {
		abort();
	}
	request(&pol, data, size);

	/* The same bytes as a policy document, and as a URL path to canonicalize. */
	struct policy p;
	memset(&p, 0, sizeof(p));
	err[0] = '\0';
	if (policy_parse((const char *)data, size, &p, err, sizeof(err)) == 0) {
		for (size_t i = 0; i < p.ncreds; i++)
			if (!policy_find(&p, p.creds[i].name))
				abort();
		policy_free(&p);
	} else {
		one_line(err);
	}
	char *s = fuzz_strdup(data, size);
	if (s) {
		char canon[256];
		const char *why = NULL;
		if (policy_path_canon(s, size & 1, canon, sizeof(canon), &why) == 0 &&
		    !memchr(canon, 0, sizeof(canon)))
			abort();
		(void)policy_host_match("*.svc.example", s);
		free(s);
	}
	/* As an answer to scrub (escapes, entities, separators): the raw secret never survives. */
	static struct scrubber sc;
	static const char secret[] = "Ab1&x\"<y>'Q";
	if (!sc.n && scrub_add(&sc, secret, sizeof(secret) - 1))
		abort();
	size_t olen;
	char *o = scrub_apply(&sc, (const char *)data, size, &olen);
	if (o) {
		if (memmem(o, olen, secret, sizeof(secret) - 1) || o[olen])
			abort();
		free(o);
	}
	return 0;
}
