/* broker/inject.c: the upstream head with the credential injected only where and for whom the
 * policy says, refusals, and the scrubber built for the response. */
#include "helpers.h"

#include "broker/inject.h"
#include "common/base64.h"

#define SECRET "S3cr3t-t0ken-VALUE"

static const char policy_json[] =
    "{\"credentials\": {"
    "\"gh\": {\"helper\": [\"/bin/true\"],"
    "  \"inject\": {\"header\": \"Authorization\", \"template\": \"Bearer {password}\"},"
    "  \"allow\": {\"hosts\": [\"api.test\", \"*.example.net\"]}},"
    "\"git\": {\"helper\": [\"/bin/true\"],"
    "  \"inject\": {\"header\": \"Authorization\","
    "              \"template\": \"Basic {username}:{password}\"},"
    "  \"allow\": {\"hosts\": [\"git.test\"]}}"
    "}}";

struct fx {
	struct policy pol;
	struct secret sec;
};

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	char err[256];

	assert_non_null(f);
	assert_int_equal(policy_parse(policy_json, strlen(policy_json), &f->pol, err, sizeof(err)),
			 0);
	strcpy(f->sec.username, "x-access-token");
	strcpy(f->sec.password, SECRET);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;

	policy_free(&f->pol);
	secret_wipe(&f->sec);
	free(f);
	return 0;
}

/* Builds a head for host with the headers given as name, value pairs (NULL-terminated). */
static int build(struct fx *f, const char *cred, const char *host, const char *target,
		 const char *const *hv, char **out, char *err)
{
	struct inject_hdr h[16];
	struct inject_req rq = {.method = "GET", .target = target, .host = host, .port = 443};
	size_t outlen, n = 0;
	const struct cred_policy *c = cred ? policy_find(&f->pol, cred) : NULL;

	for (; hv[2 * n]; n++) {
		h[n].name = hv[2 * n];
		h[n].value = hv[2 * n + 1];
	}
	rq.h = h;
	rq.nh = n;
	err[0] = '\0';
	return inject_build_head(&rq, c, c ? &f->sec : NULL, out, &outlen, err, 256);
}

static void test_template_added(void **state)
{
	struct fx *f = *state;
	const char *hv[] = {"Host",	  "api.test",	     "Accept", "*/*", "Connection",
			    "keep-alive", "Accept-Encoding", "gzip",   NULL};
	char *out, err[256];

	assert_int_equal(build(f, "gh", "api.test", "/v1/x?q=1", hv, &out, err), 0);
	assert_true(!strncmp(out, "GET /v1/x?q=1 HTTP/1.1\r\nHost: api.test\r\n", 40));
	assert_non_null(strstr(out, "\r\nAuthorization: Bearer " SECRET "\r\n"));
	assert_non_null(strstr(out, "\r\nAccept: */*\r\n"));
	assert_non_null(strstr(out, "\r\nAccept-Encoding: identity\r\n"));
	assert_null(strstr(out, "gzip"));
	assert_null(strstr(out, "keep-alive"));
	assert_non_null(strstr(out, "\r\nConnection: close\r\n\r\n"));
	free(out);
}

static void test_guest_header_replaced(void **state)
{
	struct fx *f = *state;
	const char *hv[] = {"Host", "api.test", "authorization", "Bearer guest-made-up", NULL};
	char *out, err[256];

	assert_int_equal(build(f, "gh", "api.test", "/", hv, &out, err), 0);
	assert_null(strstr(out, "guest-made-up"));
	assert_non_null(strstr(out, "Authorization: Bearer " SECRET "\r\n"));
	free(out);
}

static void test_placeholder_in_header(void **state)
{
	struct fx *f = *state;
	const char *hv[] = {"Host", "sub.example.net", "Authorization", "token cove-credential:gh",
			    NULL};
	char *out, err[256];

	assert_int_equal(build(f, "gh", "sub.example.net", "/", hv, &out, err), 0);
	assert_non_null(strstr(out, "\r\nAuthorization: token " SECRET "\r\n"));
	assert_null(strstr(out, "cove-credential"));
	free(out);
}

static void test_basic_placeholder(void **state)
{
	struct fx *f = *state;
	char guest[128], want[128], *out, err[256];
	const char *plain = "x-access-token:cove-credential:git";
	const char *hv[] = {"Host", "git.test", "Authorization", guest, NULL};

	strcpy(guest, "Basic ");
	b64_encode((const uint8_t *)plain, strlen(plain), guest + 6);
	strcpy(want, "Authorization: Basic ");
	b64_encode((const uint8_t *)"x-access-token:" SECRET, strlen("x-access-token:" SECRET),
		   want + strlen(want));
	assert_int_equal(build(f, "git", "git.test", "/org/repo.git/info/refs", hv, &out, err), 0);
	assert_non_null(strstr(out, want));
	free(out);
}

static void test_basic_template(void **state)
{
	struct fx *f = *state;
	const char *hv[] = {"Host", "git.test:443", NULL};
	char want[128], *out, err[256];

	strcpy(want, "Authorization: Basic ");
	b64_encode((const uint8_t *)"x-access-token:" SECRET, strlen("x-access-token:" SECRET),
		   want + strlen(want));
	assert_int_equal(build(f, "git", "git.test", "/", hv, &out, err), 0);
	assert_non_null(strstr(out, want));
	free(out);
}

static void assert_refused(struct fx *f, const char *cred, const char *host, const char *target,
			   const char *const *hv, const char *needle)
{
	char *out = (char *)"unset", err[256];

	assert_int_equal(build(f, cred, host, target, hv, &out, err), -EACCES);
	assert_null(out);
	assert_one_line_error(err, needle);
	assert_null(strstr(err, SECRET));
}

static void test_refusals(void **state)
{
	struct fx *f = *state;
	const char *evil[] = {"Host", "evil.test", NULL};
	const char *suffix_only[] = {"Host", "example.net", NULL};
	const char *other_hdr[] = {"Host", "api.test", "X-Token", "cove-credential:gh", NULL};
	const char *other_name[] = {"Host", "api.test", "Authorization",
				    "Bearer cove-credential:git", NULL};
	const char *case_trick[] = {"Host", "api.test", "Authorization",
				    "Bearer Cove-Credential:gh", NULL};
	const char *host_mismatch[] = {"Host", "evil.test", NULL};
	const char *two_hosts[] = {"Host", "api.test", "Host", "evil.test", NULL};
	const char *no_host[] = {"Accept", "*/*", NULL};
	const char *ok[] = {"Host", "api.test", NULL};

	assert_refused(f, "gh", "evil.test", "/", evil, "not for host evil.test");
	assert_refused(f, "gh", "example.net", "/", suffix_only, "not for host");
	assert_refused(f, "gh", "api.test", "/", other_hdr, "outside the injected header");
	assert_refused(f, "gh", "api.test", "/", other_name, "other than");
	assert_refused(f, "gh", "api.test", "/", case_trick, "other than");
	assert_refused(f, "gh", "api.test", "/", host_mismatch, "Host header");
	assert_refused(f, "gh", "api.test", "/", two_hosts, "Host header");
	assert_refused(f, "gh", "api.test", "/", no_host, "Host header");
	assert_refused(f, "gh", "api.test", "/x?t=cove-credential:gh", ok, "URL");
	/* Without a credential a placeholder is refused just the same (and nothing is filled). */
	assert_refused(f, NULL, "api.test", "/", other_hdr, "outside");
}

static void test_bad_heads(void **state)
{
	struct fx *f = *state;
	const char *bad_value[] = {"Host", "api.test", "X-A", "a\r\nX-Injected: 1", NULL};
	const char *bad_name[] = {"Host", "api.test", "X A", "1", NULL};
	const char *ok[] = {"Host", "api.test", NULL};
	char *out, err[256];

	assert_int_equal(build(f, "gh", "api.test", "/", bad_value, &out, err), -EINVAL);
	assert_int_equal(build(f, "gh", "api.test", "/", bad_name, &out, err), -EINVAL);
	assert_int_equal(build(f, "gh", "api.test", "http://api.test/", ok, &out, err), -EINVAL);
	assert_int_equal(build(f, "gh", "api.test", "/a b", ok, &out, err), -EINVAL);
}

static void test_framing(void **state)
{
	struct inject_hdr h[] = {
	    {"Host", "api.test"}, {"Transfer-Encoding", "chunked"}, {"Content-Length", "5"}};
	struct inject_req rq = {.method = "POST",
				.target = "/",
				.host = "api.test",
				.port = 443,
				.h = h,
				.nh = 3,
				.chunked = 1};
	char *out, err[256];
	size_t len;

	(void)state;
	assert_int_equal(inject_build_head(&rq, NULL, NULL, &out, &len, err, sizeof(err)), 0);
	assert_non_null(strstr(out, "\r\nTransfer-Encoding: chunked\r\n"));
	assert_null(strstr(out, "Content-Length"));
	assert_null(strstr(out, "Authorization"));
	free(out);
	rq.chunked = 0;
	rq.has_length = 1;
	rq.content_length = 42;
	assert_int_equal(inject_build_head(&rq, NULL, NULL, &out, &len, err, sizeof(err)), 0);
	assert_non_null(strstr(out, "\r\nContent-Length: 42\r\n"));
	assert_null(strstr(out, "chunked"));
	assert_int_equal(len, strlen(out));
	free(out);
}

static void test_scrubber(void **state)
{
	struct fx *f = *state;
	struct scrubber sc = {0};
	char text[256], *clean;
	size_t n;

	assert_int_equal(inject_scrubber(&sc, policy_find(&f->pol, "git"), &f->sec), 0);
	strcpy(text, "a " SECRET " b Basic ");
	b64_encode((const uint8_t *)"x-access-token:" SECRET, strlen("x-access-token:" SECRET),
		   text + strlen(text));
	clean = scrub_apply(&sc, text, strlen(text), &n);
	assert_non_null(clean);
	assert_null(strstr(clean, SECRET));
	assert_null(strstr(clean, text + strlen("a " SECRET " b Basic ")));
	assert_non_null(strstr(clean, "[REDACTED]"));
	free(clean);
	scrub_free(&sc);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_template_added, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_guest_header_replaced, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_placeholder_in_header, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_basic_placeholder, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_basic_template, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_bad_heads, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_framing, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_scrubber, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
