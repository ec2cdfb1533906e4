/* Unit tests for cove-broker's policy: file parsing and errors, URL splitting, host wildcards,
 * ports, paths, methods, expiry, max uses, the rate window, and private-address detection. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dest.h"
#include "fetch.h"
#include "policy.h"
#include "url.h"

#define S 1000000000LL

static const char good_policy[] =
    "{\"credentials\":{"
    "\"demo\":{\"helper\":[\"/bin/helper\",\"x\"],"
    "\"helper_input\":{\"protocol\":\"https\",\"host\":\"api.example.com\"},"
    "\"inject\":{\"header\":\"Authorization\",\"template\":\"Bearer {password}\"},"
    "\"allow\":{\"schemes\":[\"http\",\"https\"],"
    "\"hosts\":[\"127.0.0.1\",\"api.example.com\",\"*.svc.example\"],"
    "\"ports\":[8080,443],\"path_prefixes\":[\"/v1/\",\"/health\"],"
    "\"methods\":[\"GET\",\"POST\"]},"
    "\"ttl_s\":60,\"rate_per_min\":3,\"max_uses\":5,\"allow_private\":true},"
    "\"min\":{\"helper\":[\"h\"],\"inject\":{\"header\":\"X-Key\",\"template\":\"{username}\"},"
    "\"allow\":{\"hosts\":[\"example.org\"]}}}}";

static void load(struct policy *p)
{
	char err[256] = "";

	assert_int_equal(policy_parse(good_policy, strlen(good_policy), p, err, sizeof(err)), 0);
}

static void test_policy_parse_good(void **state)
{
	struct policy p;
	struct cred_policy *c;

	(void)state;
	load(&p);
	assert_int_equal(p.ncreds, 2);
	c = policy_find(&p, "demo");
	assert_non_null(c);
	assert_int_equal(c->helper.n, 2);
	assert_int_equal(c->input_keys.n, 2);
	assert_string_equal(c->inject_header, "Authorization");
	assert_int_equal(c->nports, 2);
	assert_int_equal(c->ttl_s, 60);
	assert_int_equal(c->rate_per_min, 3);
	assert_int_equal(c->max_uses, 5);
	assert_true(c->allow_private);
	/* Defaults: https only, "/" and GET. */
	c = policy_find(&p, "min");
	assert_string_equal(c->schemes.v[0], "https");
	assert_string_equal(c->path_prefixes.v[0], "/");
	assert_string_equal(c->methods.v[0], "GET");
	assert_false(c->allow_private);
	assert_null(policy_find(&p, "nope"));
	policy_free(&p);
}

static void expect_bad(const char *doc, const char *needle)
{
	struct policy p;
	char err[256] = "";

	assert_int_equal(policy_parse(doc, strlen(doc), &p, err, sizeof(err)), -EINVAL);
	if (!strstr(err, needle))
		fail_msg("error \"%s\" lacks \"%s\"", err, needle);
	assert_null(strchr(err, '\n'));
}

#define CRED(body) "{\"credentials\":{\"c\":{" body "}}}"
#define BASE	   "\"helper\":[\"h\"],\"inject\":{\"header\":\"A\",\"template\":\"{password}\"}"
#define ALLOW	   "\"allow\":{\"hosts\":[\"h.example\"]}"

/* Each policy file is refused with -EINVAL and a one-line error naming the problem. */
struct bad_policy {
	const char *doc, *needle;
};

static void expect_bad_each(const struct bad_policy *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		expect_bad(b[i].doc, b[i].needle);
}

static void test_policy_parse_errors(void **state)
{
	static const struct bad_policy bad[] = {
	    {"{", "policy: line"},
	    {"[]", "top level must be an object"},
	    {"{\"credentials\":{},\"x\":1}", "unknown key \"x\""},
	    {"{\"credentials\":{}}", "1..256 entries"},
	    {CRED(BASE "," ALLOW ",\"colour\":1"), "unknown key \"colour\""},
	    {CRED(BASE "," ALLOW ",\"ttl_s\":\"1\""), "ttl_s must be an integer"},
	    {CRED(BASE "," ALLOW ",\"rate_per_min\":-1"), "rate_per_min"},
	    {CRED(BASE "," ALLOW ",\"allow_private\":1"), "allow_private must be true"},
	    {CRED(BASE), "allow is required"},
	    {CRED(ALLOW ",\"inject\":{\"header\":\"A\",\"template\":\"{password}\"}"),
	     "helper is required"},
	    {CRED(BASE ",\"allow\":{\"hosts\":[\"a\"],\"ports\":[0]}"), "allow.ports[0]"},
	    {CRED(BASE ",\"allow\":{\"hosts\":[\"a\"],\"ports\":[\"80\"]}"), "allow.ports[0]"},
	    {CRED(BASE ",\"allow\":{\"hosts\":[\"a\"],\"schemes\":[\"ftp\"]}"),
	     "only \"http\" and \"https\""},
	    {CRED(BASE ",\"allow\":{\"hosts\":[\"a.*.com\"]}"), "allow.hosts[0]"},
	    {CRED(BASE ",\"allow\":{\"hosts\":[\"*\"]}"), "allow.hosts[0]"},
	    {CRED(BASE ",\"allow\":{\"hosts\":[]}"), "allow.hosts must be an array"},
	    {CRED(BASE ",\"allow\":{\"hosts\":[\"a\"],\"path_prefixes\":[\"v1\"]}"),
	     "must start with '/'"},
	    {CRED(BASE ",\"allow\":{\"hosts\":[\"a\"],\"methods\":[\"G T\"]}"), "allow.methods[0]"},
	    {CRED(BASE ",\"allow\":{\"hosts\":[\"a\"],\"extra\":1}"), "unknown key allow.extra"},
	    {CRED("\"helper\":[\"h\"]," ALLOW
		  ",\"inject\":{\"header\":\"A\",\"template\":\"{secret}\"}"),
	     "only {password} and {username}"},
	    {CRED("\"helper\":[\"h\"]," ALLOW
		  ",\"inject\":{\"header\":\"A B\",\"template\":\"{password}\"}"),
	     "not a header name"},
	    {CRED(BASE "," ALLOW ",\"helper_input\":{\"k\":\"a\\nb\"}"), "single-line"},
	    {CRED("\"helper\":\"h\"," ALLOW ",\"inject\":{\"header\":\"A\","
		  "\"template\":\"{password}\"}"),
	     "helper must be an array"},
	    {"{\"credentials\":{\"c\":{" BASE "," ALLOW "},\"c\":{}}}", "policy: line"},
	};

	(void)state;
	expect_bad_each(bad, sizeof(bad) / sizeof(bad[0]));
	/* Found by fuzz_broker: a key or credential name with a newline or an escape sequence went
	 * into the error as it was (two lines, or terminal control, on the broker's stderr). */
	expect_bad("{\"cred\\ntials\":{}}", "unknown key");
	expect_bad("{\"credentials\":{\"c\":{" BASE ",\"x\\n\\u001b[2J\":1}}}", "unknown key");
	char err[256] = "";
	struct policy p;
	const char *esc = "{\"\\u001b]0;x\\u0007\":1}";
	assert_int_equal(policy_parse(esc, strlen(esc), &p, err, sizeof(err)), -EINVAL);
	assert_null(strchr(err, '\x1b'));
}

static void test_url_split(void **state)
{
	struct url_parts u;
	char err[256];

	(void)state;
	assert_int_equal(url_split("HTTPS://API.Example.COM/v1/x?y=1#frag", &u, err, sizeof(err)),
			 0);
	assert_string_equal(u.scheme, "https");
	assert_string_equal(u.host, "api.example.com");
	assert_int_equal(u.port, 443);
	assert_string_equal(u.path, "/v1/x");
	url_parts_free(&u);
	assert_int_equal(url_split("http://127.0.0.1:8080/a/../v1/./b", &u, err, sizeof(err)), 0);
	assert_int_equal(u.port, 8080);
	assert_string_equal(u.path, "/v1/b");
	assert_true(u.host_is_ip);
	url_parts_free(&u);
	assert_int_equal(url_split("http://[::1]:81/", &u, err, sizeof(err)), 0);
	assert_string_equal(u.host, "::1");
	url_parts_free(&u);
	assert_int_equal(url_split("http://user:pw@h/", &u, err, sizeof(err)), -EINVAL);
	assert_int_equal(url_split("http://h/v1/%2e%2e/admin", &u, err, sizeof(err)), -EINVAL);
	assert_int_equal(url_split("http://h/a b", &u, err, sizeof(err)), -EINVAL);
	assert_int_equal(url_split("not a url", &u, err, sizeof(err)), -EINVAL);
	assert_int_equal(url_split("", &u, err, sizeof(err)), -EINVAL);
	assert_int_equal(url_split("http://h:99999/", &u, err, sizeof(err)), -EINVAL);
}

static void test_host_match(void **state)
{
	(void)state;
	assert_true(policy_host_match("api.example.com", "api.example.com"));
	assert_true(policy_host_match("api.example.com", "API.example.com"));
	assert_false(policy_host_match("api.example.com", "xapi.example.com"));
	assert_false(policy_host_match("api.example.com", "api.example.com.evil"));
	assert_true(policy_host_match("*.example.com", "a.example.com"));
	assert_true(policy_host_match("*.example.com", "a.b.example.com"));
	assert_false(policy_host_match("*.example.com", "example.com"));
	assert_false(policy_host_match("*.example.com", "evilexample.com"));
	assert_false(policy_host_match("*.example.com", ".example.com"));
}

static const char *check(struct cred_policy *c, const char *url, const char *method, int64_t now,
			 int64_t start)
{
	static char reason[64];
	struct url_parts u;
	const char *r;

	assert_int_equal(url_split(url, &u, NULL, 0), 0);
	r = policy_check(c, &u, method, now, start);
	snprintf(reason, sizeof(reason), "%s", r ? r : "ok");
	url_parts_free(&u);
	return reason;
}

static void test_policy_check(void **state)
{
	struct policy p;
	struct cred_policy *c, *m;

	(void)state;
	load(&p);
	c = policy_find(&p, "demo");
	m = policy_find(&p, "min");
	assert_string_equal(check(c, "http://127.0.0.1:8080/v1/x", "GET", S, 0), "ok");
	assert_string_equal(check(c, "https://api.example.com/v1/", "POST", S, 0), "ok");
	assert_string_equal(check(c, "https://a.b.svc.example/v1/", "GET", S, 0), "ok");
	assert_string_equal(check(c, "https://svc.example/v1/", "GET", S, 0), "host not allowed");
	assert_string_equal(check(c, "http://localhost:8080/v1/", "GET", S, 0), "host not allowed");
	assert_string_equal(check(c, "http://127.0.0.1:8081/v1/", "GET", S, 0), "port not allowed");
	assert_string_equal(check(c, "http://127.0.0.1/v1/", "GET", S, 0), "port not allowed");
	assert_string_equal(check(c, "http://127.0.0.1:8080/v2/", "GET", S, 0), "path not allowed");
	assert_string_equal(check(c, "http://127.0.0.1:8080/v1", "GET", S, 0), "path not allowed");
	/* Prefixes match whole segments: "/health" is not a prefix of "/healthz". */
	assert_string_equal(check(c, "http://127.0.0.1:8080/health", "GET", S, 0), "ok");
	assert_string_equal(check(c, "http://127.0.0.1:8080/health/x", "GET", S, 0), "ok");
	assert_string_equal(check(c, "http://127.0.0.1:8080/healthz", "GET", S, 0),
			    "path not allowed");
	assert_string_equal(check(c, "http://127.0.0.1:8080/v1/", "DELETE", S, 0),
			    "method not allowed");
	assert_string_equal(check(c, "http://127.0.0.1:8080/v1/", "get", S, 0),
			    "method not allowed");
	/* Expiry: ttl 60 s from start (or grant). */
	assert_string_equal(check(c, "http://127.0.0.1:8080/v1/", "GET", 100 * S + 59 * S, 100 * S),
			    "ok");
	assert_string_equal(check(c, "http://127.0.0.1:8080/v1/", "GET", 160 * S, 100 * S),
			    "expired");
	/* Defaults of "min": https on 443 only, GET only. */
	assert_string_equal(check(m, "https://example.org/anything", "GET", S, 0), "ok");
	assert_string_equal(check(m, "http://example.org/", "GET", S, 0), "scheme not allowed");
	assert_string_equal(check(m, "https://example.org:8443/", "GET", S, 0), "port not allowed");
	assert_string_equal(check(m, "https://example.org/", "POST", S, 0), "method not allowed");
	policy_free(&p);
}

static void test_rate_and_uses(void **state)
{
	struct policy p;
	struct cred_policy *c;
	const char *url = "http://127.0.0.1:8080/v1/";
	int64_t t = 1000 * S;
	int i;

	(void)state;
	load(&p);
	c = policy_find(&p, "demo");
	c->ttl_s = 0;
	/* 3 per minute: the 4th within 60 s is over rate, then allowed once the oldest ages out. */
	for (i = 0; i < 3; i++) {
		assert_string_equal(check(c, url, "GET", t + i * S, 0), "ok");
		policy_consume(c, t + i * S);
	}
	assert_string_equal(check(c, url, "GET", t + 10 * S, 0), "over rate");
	assert_string_equal(check(c, url, "GET", t + 59 * S, 0), "over rate");
	assert_string_equal(check(c, url, "GET", t + 60 * S, 0), "ok");
	policy_consume(c, t + 60 * S);
	assert_string_equal(check(c, url, "GET", t + 60 * S + 1, 0), "over rate");
	assert_string_equal(check(c, url, "GET", t + 61 * S, 0), "ok");
	policy_consume(c, t + 61 * S);
	/* max_uses 5: 5 consumed, the 6th is refused whatever the rate. */
	assert_int_equal(c->uses, 5);
	assert_string_equal(check(c, url, "GET", t + 500 * S, 0), "max uses");
	policy_free(&p);
}

/* Headers are an allowlist per credential: the request-routing ones (method override, original
 * URL, X-Forwarded-*) never pass, whatever the policy says. */
static void test_header_allowlist(void **state)
{
	static const char doc[] =
	    CRED(BASE ",\"allow\":{\"hosts\":[\"h\"],\"headers\":[\"Accept\",\"X-Trace\"]}");
	static const struct bad_policy bad[] = {
	    {CRED(BASE ",\"allow\":{\"hosts\":[\"h\"],\"headers\":[\"X-HTTP-Method-Override\"]}"),
	     "allow.headers[0]"},
	    {CRED(BASE ",\"allow\":{\"hosts\":[\"h\"],\"headers\":[\"X-Forwarded-Proto\"]}"),
	     "allow.headers[0]"},
	    {CRED(BASE ",\"allow\":{\"hosts\":[\"h\"],\"headers\":[\"Host\"]}"),
	     "allow.headers[0]"},
	    {CRED(BASE ",\"allow\":{\"hosts\":[\"h\"],\"headers\":[\"a\"]}"),
	     "names the inject header"},
	};
	struct policy p;
	struct cred_policy *c;
	char err[256];

	(void)state;
	load(&p);
	c = policy_find(&p, "demo");
	/* The default list. */
	assert_true(policy_header_allowed(c, "Accept: */*"));
	assert_true(policy_header_allowed(c, "content-type: text/plain"));
	assert_true(policy_header_allowed(c, "User-Agent: x"));
	assert_false(policy_header_allowed(c, "X-HTTP-Method-Override: DELETE"));
	assert_false(policy_header_allowed(c, "X-Original-URL: /admin"));
	assert_false(policy_header_allowed(c, "X-Rewrite-URL: /admin"));
	assert_false(policy_header_allowed(c, "X-Forwarded-For: 127.0.0.1"));
	assert_false(policy_header_allowed(c, "x-forwarded-host: evil"));
	assert_false(policy_header_allowed(c, "Forwarded: for=127.0.0.1"));
	assert_false(policy_header_allowed(c, "X-Unknown: 1"));
	assert_false(policy_header_allowed(c, "Host: evil"));
	assert_false(policy_header_allowed(c, "Authorization: Bearer guess"));
	assert_false(policy_header_allowed(c, "Accept-Encoding: br"));
	assert_false(policy_header_allowed(c, "Accepted: 1"));
	policy_free(&p);
	/* An explicit list replaces the default. */
	assert_int_equal(policy_parse(doc, strlen(doc), &p, err, sizeof(err)), 0);
	c = policy_find(&p, "c");
	assert_true(policy_header_allowed(c, "x-trace: 1"));
	assert_true(policy_header_allowed(c, "Accept: 1"));
	assert_false(policy_header_allowed(c, "User-Agent: x"));
	policy_free(&p);
	/* A policy cannot allow the routing headers or the inject header. */
	expect_bad_each(bad, sizeof(bad) / sizeof(bad[0]));
}

/* The path check compares canonical segments: ';' parameters, dot segments in any spelling and
 * encoded separators never reach a server that would read them differently. */
static void test_path_bypass(void **state)
{
	static const char doc[] = CRED(BASE ",\"allow\":{\"hosts\":[\"h\"],\"path_prefixes\":"
					    "[\"/v1/\",\"/%76%32\"],\"path_params\":true}");
	struct policy p;
	struct cred_policy *c;
	char err[256], canon[64];
	const char *why;

	(void)state;
	load(&p);
	c = policy_find(&p, "demo");
	assert_string_equal(check(c, "http://127.0.0.1:8080/v1/..;/admin", "GET", S, 0),
			    "path has ';' parameters");
	assert_string_equal(check(c, "http://127.0.0.1:8080/v1;x=1/a", "GET", S, 0),
			    "path has ';' parameters");
	policy_free(&p);
	/* Percent-decoded segments: "/%76%31/" is "/v1/"; "%252e" would be ".." after a second
	 * decode; a bad escape is refused. */
	assert_int_equal(policy_path_canon("/%76%31/x", false, canon, sizeof(canon), &why), 0);
	assert_string_equal(canon, "/v1/x");
	assert_int_equal(policy_path_canon("/v1/%252e%252e/a", false, canon, sizeof(canon), &why),
			 -EINVAL);
	assert_int_equal(policy_path_canon("/v1/%zz", false, canon, sizeof(canon), &why), -EINVAL);
	assert_int_equal(policy_path_canon("/v1/%3b/a", true, canon, sizeof(canon), &why), -EINVAL);
	assert_int_equal(policy_path_canon("/v1/%5c..", false, canon, sizeof(canon), &why),
			 -EINVAL);
	assert_int_equal(policy_path_canon("/v1/%00", false, canon, sizeof(canon), &why), -EINVAL);
	assert_int_equal(policy_path_canon("/v1/..", false, canon, sizeof(canon), &why), -EINVAL);
	assert_string_equal(why, "path has a dot segment");
	assert_int_equal(policy_path_canon("/v1/.", false, canon, sizeof(canon), &why), -EINVAL);
	assert_int_equal(policy_path_canon("/v1/...", false, canon, sizeof(canon), &why), 0);
	assert_int_equal(policy_path_canon("/v1/x", false, canon, 4, &why), -EINVAL);
	/* With path_params, parameters are cut off before matching, and "..;x" is still "..". */
	assert_int_equal(policy_parse(doc, strlen(doc), &p, err, sizeof(err)), 0);
	c = policy_find(&p, "c");
	assert_string_equal(check(c, "https://h/v1;jsessionid=1/a", "GET", S, 0), "ok");
	assert_string_equal(check(c, "https://h/v1/..;/admin", "GET", S, 0),
			    "path has a dot segment");
	assert_string_equal(check(c, "https://h/v1/.;x/a", "GET", S, 0), "path has a dot segment");
	assert_string_equal(check(c, "https://h/v2/x", "GET", S, 0), "ok");
	assert_string_equal(check(c, "https://h/v2x", "GET", S, 0), "path not allowed");
	policy_free(&p);
	expect_bad(CRED(BASE ",\"allow\":{\"hosts\":[\"h\"],\"path_prefixes\":[\"/a/../b\"]}"),
		   "dot segment");
	expect_bad(CRED(BASE ",\"allow\":{\"hosts\":[\"h\"],\"path_prefixes\":[\"/a;b\"]}"),
		   "';' parameters");
}

/* Whether this host's resolver knows "localhost" (glibc reads it from /etc/hosts). */
static bool localhost_resolves(void)
{
	struct addrinfo *ai = NULL;
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
	bool ok = getaddrinfo("localhost", "80", &hints, &ai) == 0;

	if (ai)
		freeaddrinfo(ai);
	return ok;
}

static int v4(const char *a)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};

	assert_int_equal(inet_pton(AF_INET, a, &sa.sin_addr), 1);
	return dest_addr_is_private((struct sockaddr *)&sa);
}

static int v6(const char *a)
{
	struct sockaddr_in6 sa = {.sin6_family = AF_INET6};

	assert_int_equal(inet_pton(AF_INET6, a, &sa.sin6_addr), 1);
	return dest_addr_is_private((struct sockaddr *)&sa);
}

static void test_private_addrs(void **state)
{
	char pin[256];

	(void)state;
	assert_true(v4("127.0.0.1"));
	assert_true(v4("10.1.2.3"));
	assert_true(v4("172.16.0.1"));
	assert_true(v4("172.31.255.255"));
	assert_false(v4("172.32.0.1"));
	assert_true(v4("192.168.1.1"));
	assert_true(v4("169.254.169.254"));
	assert_true(v4("100.64.0.1"));
	assert_false(v4("100.128.0.1"));
	assert_true(v4("0.0.0.0"));
	assert_true(v4("224.0.0.1"));
	assert_true(v4("255.255.255.255"));
	assert_false(v4("93.184.216.34"));
	assert_false(v4("8.8.8.8"));
	assert_true(v6("::1"));
	assert_true(v6("::"));
	assert_true(v6("fe80::1"));
	assert_true(v6("fd00::1"));
	assert_true(v6("::ffff:127.0.0.1"));
	assert_true(v6("::ffff:10.0.0.1"));
	assert_false(v6("::ffff:8.8.8.8"));
	assert_true(v6("64:ff9b::a00:1"));
	assert_true(v6("ff02::1"));
	assert_false(v6("2606:4700::1111"));
	/* Literal addresses need no pin; a private one is refused unless allowed. */
	assert_int_equal(dest_resolve("127.0.0.1", 80, false, pin, sizeof(pin)), -EACCES);
	assert_int_equal(dest_resolve("127.0.0.1", 80, true, pin, sizeof(pin)), 0);
	assert_string_equal(pin, "");
	assert_int_equal(dest_resolve("::1", 80, false, pin, sizeof(pin)), -EACCES);
	/* "localhost" resolves (from /etc/hosts) to loopback: refused, or pinned when allowed. A
	 * bare tree (a chroot made by mmdebstrap) may have no /etc/hosts: then it must fail closed.
	 */
	if (localhost_resolves()) {
		assert_int_equal(dest_resolve("localhost", 8080, false, pin, sizeof(pin)), -EACCES);
		assert_int_equal(dest_resolve("localhost", 8080, true, pin, sizeof(pin)), 0);
		assert_non_null(strstr(pin, "localhost:8080:"));
		assert_non_null(strstr(pin, "127.0.0.1"));
	} else {
		print_message(
		    "no resolver entry for localhost here (no /etc/hosts?): checking that "
		    "it is refused, not the pin\n");
		assert_int_not_equal(dest_resolve("localhost", 8080, false, pin, sizeof(pin)), 0);
	}
	assert_int_equal(dest_resolve("no-such-host.invalid", 80, true, pin, sizeof(pin)), -ENOENT);
}

/* Issue 27: documentation, benchmarking and local-use NAT64 blocks, and 6to4 judged by the
 * IPv4 address it embeds. */
static void test_private_ranges_more(void **state)
{
	(void)state;
	assert_true(v4("192.0.2.1"));
	assert_true(v4("192.0.2.255"));
	assert_false(v4("192.0.3.1"));
	assert_true(v4("198.51.100.7"));
	assert_false(v4("198.51.101.7"));
	assert_true(v4("203.0.113.9"));
	assert_false(v4("203.0.114.9"));
	/* 6to4: the embedded IPv4 address decides. */
	assert_true(v6("2002:c000:0201::"));	/* 192.0.2.1 */
	assert_true(v6("2002:c000:0201::1"));	/* 192.0.2.1 */
	assert_true(v6("2002:7f00:0001::1"));	/* 127.0.0.1 */
	assert_true(v6("2002:a9fe:a9fe::1"));	/* 169.254.169.254 */
	assert_true(v6("2002:0a00:0001:1::1")); /* 10.0.0.1 */
	assert_false(v6("2002:0808:0808::1"));	/* 8.8.8.8 */
	assert_false(v6("2002:5db8:d822::1"));	/* 93.184.216.34 */
	/* Local-use NAT64, whatever follows; the well-known prefix still by its IPv4 address. */
	assert_true(v6("64:ff9b:1::808:808"));
	assert_true(v6("64:ff9b:1:ffff::1"));
	assert_false(v6("64:ff9b::808:808"));
	assert_false(v6("64:ff9b:2::1"));
	assert_true(v6("2001:db8::1"));
	assert_true(v6("2001:db8:ffff::1"));
	assert_false(v6("2001:db9::1"));
	assert_true(v6("3fff::1"));
	assert_true(v6("3fff:0fff:ffff::1"));
	assert_false(v6("3fff:1000::1"));
	assert_true(v6("2001:2::1"));
	assert_true(v6("2001:2:0:ffff::1"));
	assert_false(v6("2001:2:1::1"));
	assert_false(v6("2001:3::1"));
}

/* Issue 27: a path that is not valid UTF-8, raw or percent-decoded (overlong forms, surrogates,
 * stray continuation bytes, cut characters), is refused: a lenient server might read "%c0%ae"
 * as '.'. */
static void test_path_utf8(void **state)
{
	static const char *const bad[] = {
	    "/v1/%c0%ae%c0%ae/admin", /* overlong '.' */
	    "/v1/\xc0\xae\xc0\xae/admin",
	    "/v1/%c0\xae%c0\xae/admin", /* one escaped, one raw byte */
	    "/v1/%c0%af",		/* overlong '/' */
	    "/v1/%e0%80%ae",		/* three-byte overlong */
	    "/v1/%f0%80%80%ae",		/* four-byte overlong */
	    "/v1/%c1%bf",
	    "/v1/%ed%a0%80",	/* a surrogate */
	    "/v1/%f4%90%80%80", /* over U+10FFFF */
	    "/v1/%f5%80%80%80",
	    "/v1/%80", /* a stray continuation byte */
	    "/v1/\xbf",
	    "/v1/%ff",
	    "/v1/\xfe",
	    "/v1/%c3",	 /* cut by the end */
	    "/v1/%c3/a", /* cut by '/' */
	    "/v1/%e2%82/a",
	    "/v1/%c3;x/a",
	    "/v1;%c0%ae/a", /* in a parameter too */
	};
	static const char *const good[] = {"/v1/%c3%a9",      "/v1/\xc3\xa9",	  "/v1/%c3\xa9",
					   "/v1/%e2%82%ac",   "/v1/%f0%9f%98%80", "/v1/%ef%bf%bd",
					   "/v1/%f4%8f%bf%bf"};
	struct policy p;
	struct cred_policy *c;
	char canon[64];
	const char *why = NULL;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		why = NULL;
		if (policy_path_canon(bad[i], true, canon, sizeof(canon), &why) != -EINVAL)
			fail_msg("accepted %s", bad[i]);
		assert_string_equal(why, "path is not valid UTF-8");
	}
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		if (policy_path_canon(good[i], false, canon, sizeof(canon), &why))
			fail_msg("refused %s: %s", good[i], why);
	assert_int_equal(policy_path_canon("/v1/%c3\xa9", false, canon, sizeof(canon), &why), 0);
	assert_string_equal(canon, "/v1/\xc3\xa9");
	/* Through the whole check: the URL under a "/v1/" prefix. */
	load(&p);
	c = policy_find(&p, "demo");
	assert_string_equal(check(c, "http://127.0.0.1:8080/v1/%c0%ae%c0%ae/admin", "GET", S, 0),
			    "path is not valid UTF-8");
	assert_string_equal(check(c, "http://127.0.0.1:8080/v1/%c3%a9", "GET", S, 0), "ok");
	policy_free(&p);
}

/* The socket-level check behind the pin: curl never connects to a private address unless the
 * credential allows it (a real listener on 127.0.0.1 sees whether a connection arrived). */
static void test_fetch_socket_check(void **state)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sa);
	struct fetch_resp resp;
	char url[64], err[256];
	int lfd, cfd;

	(void)state;
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	assert_true(lfd >= 0);
	assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(lfd, 4), 0);
	assert_int_equal(getsockname(lfd, (struct sockaddr *)&sa, &sl), 0);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d/", ntohs(sa.sin_port));
	{
		struct fetch_req req = {.url = url, .method = "GET", .timeout_s = 1};

		assert_int_equal(fetch_perform(&req, &resp, err, sizeof(err)), -EIO);
		assert_true(accept(lfd, NULL, NULL) < 0 && errno == EAGAIN);
		req.allow_private = 1;
		/* Connects, sends, and times out waiting for an answer nobody writes. */
		assert_int_equal(fetch_perform(&req, &resp, err, sizeof(err)), -EIO);
		cfd = accept(lfd, NULL, NULL);
		assert_true(cfd >= 0);
		close(cfd);
	}
	close(lfd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_policy_parse_good),	cmocka_unit_test(test_policy_parse_errors),
	    cmocka_unit_test(test_url_split),		cmocka_unit_test(test_host_match),
	    cmocka_unit_test(test_policy_check),	cmocka_unit_test(test_rate_and_uses),
	    cmocka_unit_test(test_private_addrs),	cmocka_unit_test(test_fetch_socket_check),
	    cmocka_unit_test(test_header_allowlist),	cmocka_unit_test(test_path_bypass),
	    cmocka_unit_test(test_private_ranges_more), cmocka_unit_test(test_path_utf8),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
