/* Unit tests for cove-broker's message side: framing, guest request validation (bad length,
 * bad JSON, wrong types, huge), the credential-helper protocol, secret scrubbing (and the
 * encodings a server may echo a secret in), the audit hash chain, and the full guest handler on
 * malformed input. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "audit.h"
#include "common/base64.h"
#include "broker.h"
#include "frame.h"
#include "helper.h"
#include "request.h"
#include "scrub.h"

static void test_frame(void **state)
{
	uint8_t b[8] = {0};
	size_t n = 99;

	(void)state;
	assert_int_equal(frame_peek(b, 3, &n), 0);
	frame_header(b, 4);
	assert_int_equal(frame_peek(b, 4, &n), 0);
	assert_int_equal(frame_peek(b, 7, &n), 0);
	assert_int_equal(frame_peek(b, 8, &n), 1);
	assert_int_equal(n, 4);
	frame_header(b, FRAME_MAX);
	assert_int_equal(frame_peek(b, 4, &n), 0);
	frame_header(b, FRAME_MAX + 1);
	assert_int_equal(frame_peek(b, 4, &n), -EMSGSIZE);
	memset(b, 0xff, 4);
	assert_int_equal(frame_peek(b, 4, &n), -EMSGSIZE);
	frame_header(b, 0);
	assert_int_equal(frame_peek(b, 4, &n), 1);
	assert_int_equal(n, 0);
}

static void test_b64(void **state)
{
	char enc[16];
	uint8_t dec[16];
	size_t n;

	(void)state;
	b64_encode((const uint8_t *)"foob", 4, enc);
	assert_string_equal(enc, "Zm9vYg==");
	assert_int_equal(b64_decode(enc, strlen(enc), dec, &n), 0);
	assert_int_equal(n, 4);
	assert_memory_equal(dec, "foob", 4);
	assert_int_equal(b64_decode("Zm9v", 4, dec, &n), 0);
	assert_int_equal(n, 3);
	assert_int_equal(b64_decode("Zm9", 3, dec, &n), -EINVAL);
	assert_int_equal(b64_decode("Zm=v", 4, dec, &n), -EINVAL);
	assert_int_equal(b64_decode("Zg==Zg==", 8, dec, &n), -EINVAL);
	assert_int_equal(b64_decode("Z!==", 4, dec, &n), -EINVAL);
	assert_int_equal(b64_decode("", 0, dec, &n), 0);
	assert_int_equal(n, 0);
}

#define TOK "00112233445566778899aabbccddeeff"

static int parse(const char *json, struct breq *q, char *err, size_t errlen)
{
	return breq_parse((const uint8_t *)json, strlen(json), q, err, errlen);
}

static void expect_malformed(const char *json, const char *needle)
{
	struct breq q;
	char err[256] = "";

	assert_int_equal(parse(json, &q, err, sizeof(err)), -EINVAL);
	if (!strstr(err, needle))
		fail_msg("for %s: error \"%s\" lacks \"%s\"", json, err, needle);
	breq_free(&q);
}

static void test_request_parse(void **state)
{
	struct breq q;
	char err[256];

	(void)state;
	assert_int_equal(parse("{\"v\":1,\"epoch\":3,\"token\":\"" TOK "\",\"credential\":\"demo\","
			       "\"method\":\"POST\",\"url\":\"http://h/v1/\",\"headers\":[\"A: b\","
			       "\"X-Y:z\"],\"body_b64\":\"aGk=\",\"extra\":true}",
			       &q, err, sizeof(err)),
			 0);
	assert_int_equal(q.epoch, 3);
	assert_true(q.has_token);
	assert_int_equal(q.token[15], 0xff);
	assert_string_equal(q.credential, "demo");
	assert_string_equal(q.method, "POST");
	assert_int_equal(q.nheaders, 2);
	assert_int_equal(q.body_len, 2);
	assert_memory_equal(q.body, "hi", 2);
	breq_free(&q);
	/* Defaults; no epoch/token parses but is not a valid token (stale epoch later). */
	assert_int_equal(parse("{\"v\":1,\"url\":\"http://h/\"}", &q, err, sizeof(err)), 0);
	assert_string_equal(q.credential, "default");
	assert_string_equal(q.method, "GET");
	assert_false(q.has_token);
	breq_free(&q);
	assert_int_equal(
	    parse("{\"v\":1,\"epoch\":null,\"token\":null,\"url\":\"u\"}", &q, err, sizeof(err)),
	    0);
	assert_false(q.has_token);
	breq_free(&q);
	assert_int_equal(
	    parse("{\"v\":1,\"epoch\":0,\"token\":\"\",\"url\":\"u\"}", &q, err, sizeof(err)), 0);
	assert_false(q.has_token);
	breq_free(&q);
	assert_int_equal(
	    parse("{\"v\":1,\"epoch\":1,\"token\":\"abc\",\"url\":\"u\"}", &q, err, sizeof(err)),
	    0);
	assert_false(q.has_token);
	breq_free(&q);

	expect_malformed("", "bad json");
	expect_malformed("{\"v\":1", "bad json");
	expect_malformed("[1]", "not a json object");
	expect_malformed("{\"v\":1,\"v\":1,\"url\":\"u\"}", "bad json");
	expect_malformed("{\"v\":1,\"url\":5}", "must be strings");
	expect_malformed("{\"v\":1,\"url\":\"u\",\"credential\":[]}", "must be strings");
	expect_malformed("{\"v\":1}", "url missing");
	expect_malformed("{\"v\":2,\"url\":\"u\"}", "v must be 1");
	expect_malformed("{\"v\":\"1\",\"url\":\"u\"}", "v must be 1");
	expect_malformed("{\"v\":1,\"url\":\"u\",\"epoch\":-1}", "epoch");
	expect_malformed("{\"v\":1,\"url\":\"u\",\"epoch\":1.5}", "epoch");
	expect_malformed("{\"v\":1,\"url\":\"u\",\"token\":7}", "token");
	expect_malformed("{\"v\":1,\"url\":\"u\",\"method\":\"get\"}", "upper-case");
	expect_malformed("{\"v\":1,\"url\":\"u\",\"method\":\"\"}", "method");
	expect_malformed("{\"v\":1,\"url\":\"u\",\"credential\":\"\"}", "credential");
	expect_malformed("{\"v\":1,\"url\":\"u\",\"headers\":\"A: b\"}", "headers");
	expect_malformed("{\"v\":1,\"url\":\"u\",\"headers\":[1]}", "headers[0]");
	expect_malformed("{\"v\":1,\"url\":\"u\",\"headers\":[\"NoColon\"]}", "headers[0]");
	expect_malformed("{\"v\":1,\"url\":\"u\",\"headers\":[\"A: b\\r\\nHost: x\"]}",
			 "headers[0]");
	expect_malformed("{\"v\":1,\"url\":\"u\",\"headers\":[\"Bad Name: x\"]}", "headers[0]");
	expect_malformed("{\"v\":1,\"url\":\"u\",\"body_b64\":1}", "body_b64");
	expect_malformed("{\"v\":1,\"url\":\"u\",\"body_b64\":\"abc\"}", "not base64");
	expect_malformed("{\"v\":1,\"url\":\"u\\u0000x\"}", "bad json");
}

static void test_request_huge(void **state)
{
	size_t big = 2 * 1024 * 1024, i, o;
	char *j = malloc(big + 256);

	(void)state;
	assert_non_null(j);
	/* A body over the cap. */
	o = (size_t)sprintf(j, "{\"v\":1,\"url\":\"u\",\"body_b64\":\"");
	for (i = 0; i < 800 * 1024; i++)
		j[o++] = 'A';
	strcpy(j + o, "\"}");
	expect_malformed(j, "body over");
	/* Too many headers. */
	o = (size_t)sprintf(j, "{\"v\":1,\"url\":\"u\",\"headers\":[");
	for (i = 0; i < REQ_MAX_HEADERS + 1; i++)
		o += (size_t)sprintf(j + o, "%s\"A: b\"", i ? "," : "");
	strcpy(j + o, "]}");
	expect_malformed(j, "headers must be an array");
	/* One header over the cap. */
	o = (size_t)sprintf(j, "{\"v\":1,\"url\":\"u\",\"headers\":[\"A: ");
	for (i = 0; i < REQ_HEADER_MAX; i++)
		j[o++] = 'x';
	strcpy(j + o, "\"]}");
	expect_malformed(j, "headers[0]");
	/* Deep nesting is refused by the parser, not a stack overflow. */
	for (i = 0; i < 100000; i++)
		j[i] = '[';
	j[i] = '\0';
	expect_malformed(j, "bad json");
	free(j);
}

static void test_helper_parse(void **state)
{
	struct secret s;
	char err[256], *big;

	(void)state;
	assert_int_equal(helper_parse("password=pw\nusername=u\n", 23, &s, err, sizeof(err)), 0);
	assert_string_equal(s.password, "pw");
	assert_string_equal(s.username, "u");
	/* CRLF, unknown keys ignored, '=' inside the value, stops at the blank line. */
	assert_int_equal(
	    helper_parse("quit=0\r\npassword=a=b\r\n\r\npassword=late\n", 39, &s, err, sizeof(err)),
	    0);
	assert_string_equal(s.password, "a=b");
	assert_int_equal(helper_parse("password=x", 10, &s, err, sizeof(err)), 0);
	assert_string_equal(s.password, "x");
	assert_int_equal(helper_parse("", 0, &s, err, sizeof(err)), -EINVAL);
	assert_int_equal(helper_parse("protocol=https\n", 15, &s, err, sizeof(err)), -EINVAL);
	assert_int_equal(helper_parse("garbage\n", 8, &s, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "line 1"));
	assert_int_equal(helper_parse("=x\n", 3, &s, err, sizeof(err)), -EINVAL);
	/* A CR inside a value would split the injected header. */
	assert_int_equal(helper_parse("password=a\rX-Evil: 1\n", 22, &s, err, sizeof(err)),
			 -EINVAL);
	assert_int_equal(helper_parse("password=a\tb\n", 14, &s, err, sizeof(err)), -EINVAL);
	assert_int_equal(helper_parse("password=a\0b\n", 13, &s, err, sizeof(err)), -EINVAL);
	big = malloc(HELPER_OUT_MAX + 2);
	assert_non_null(big);
	memcpy(big, "password=", 9);
	memset(big + 9, 'x', HELPER_SECRET_MAX);
	assert_int_equal(helper_parse(big, 9 + HELPER_SECRET_MAX, &s, err, sizeof(err)), -E2BIG);
	memset(big, 'x', HELPER_OUT_MAX + 1);
	assert_int_equal(helper_parse(big, HELPER_OUT_MAX + 1, &s, err, sizeof(err)), -E2BIG);
	free(big);
	secret_wipe(&s);
	assert_int_equal(s.password[0], 0);
}

/* Writes an executable helper script into a temp dir and returns its path. */
static char *make_script(char *dir, const char *name, const char *body)
{
	char *path = malloc(strlen(dir) + strlen(name) + 2);
	FILE *f;

	assert_non_null(path);
	sprintf(path, "%s/%s", dir, name);
	f = fopen(path, "w");
	assert_non_null(f);
	fprintf(f, "#!/bin/sh\n%s", body);
	fclose(f);
	chmod(path, 0700);
	return path;
}

static void test_helper_run(void **state)
{
	char dir[] = "/tmp/cbu-XXXXXX", err[256], *ok, *echo, *fail, *slow, *flood;
	struct cred_policy c = {0};
	char *argv[1], *keys[] = {"protocol", "host"}, *vals[] = {"https", "api.x"};
	struct secret s;

	(void)state;
	assert_non_null(mkdtemp(dir));
	/* The helper sees "get" last and the key=value input ending with a blank line. */
	ok = make_script(dir, "ok",
			 "[ \"$1\" = get ] || exit 3\n"
			 "read a; read b; read blank\n"
			 "[ \"$a\" = protocol=https ] && [ \"$b\" = host=api.x ] && "
			 "[ -z \"$blank\" ] || exit 4\n"
			 "echo username=me; echo password=s3cret\n");
	echo = make_script(dir, "echo", "echo nonsense\n");
	fail = make_script(dir, "fail", "echo password=x; exit 1\n");
	slow = make_script(dir, "slow", "exec sleep 5\n");
	flood = make_script(dir, "flood", "exec yes password=x\n");
	c.helper.v = argv;
	c.helper.n = 1;
	c.input_keys.v = keys;
	c.input_vals.v = vals;
	c.input_keys.n = c.input_vals.n = 2;
	argv[0] = ok;
	assert_int_equal(helper_run(&c, 5000, &s, err, sizeof(err)), 0);
	assert_string_equal(s.password, "s3cret");
	assert_string_equal(s.username, "me");
	secret_wipe(&s);
	argv[0] = echo;
	assert_int_equal(helper_run(&c, 5000, &s, err, sizeof(err)), -EINVAL);
	argv[0] = fail;
	assert_int_equal(helper_run(&c, 5000, &s, err, sizeof(err)), -EIO);
	assert_int_equal(s.password[0], 0);
	argv[0] = slow;
	assert_int_equal(helper_run(&c, 300, &s, err, sizeof(err)), -ETIMEDOUT);
	argv[0] = flood;
	assert_int_equal(helper_run(&c, 5000, &s, err, sizeof(err)), -E2BIG);
	argv[0] = "/nonexistent/helper";
	assert_int_equal(helper_run(&c, 5000, &s, err, sizeof(err)), -EIO);
	unlink(ok);
	unlink(echo);
	unlink(fail);
	unlink(slow);
	unlink(flood);
	free(ok);
	free(echo);
	free(fail);
	free(slow);
	free(flood);
	rmdir(dir);
}

static char *scrub_str(const struct scrubber *s, const char *in)
{
	size_t n;
	char *out = scrub_apply(s, in, strlen(in), &n);

	assert_non_null(out);
	assert_int_equal(strlen(out), n);
	return out;
}

/* Expects in to be scrubbed to exactly want. */
static void scrubs_to(const struct scrubber *s, const char *in, const char *want)
{
	char *out = scrub_str(s, in);

	if (strcmp(out, want))
		fail_msg("scrub(\"%s\") = \"%s\", want \"%s\"", in, out, want);
	free(out);
}

static void test_scrub(void **state)
{
	const char *secret = "hunter2-Sup3rS3cret";
	struct scrubber s = {0};
	char enc[128], stream[256], wrapped[128], *out;
	unsigned k;

	(void)state;
	assert_int_equal(scrub_add(&s, secret, strlen(secret)), 0);
	assert_int_equal(scrub_add(&s, "", 0), 0);
	out = scrub_str(&s, "token=hunter2-Sup3rS3cret; again hunter2-Sup3rS3cret.");
	assert_string_equal(out, "token=[REDACTED]; again [REDACTED].");
	free(out);
	/* The plain base64 form. */
	b64_encode((const uint8_t *)secret, strlen(secret), enc);
	snprintf(stream, sizeof(stream), "x-b64: %s end", enc);
	out = scrub_str(&s, stream);
	assert_null(strstr(out, enc));
	assert_non_null(strstr(out, "[REDACTED]"));
	free(out);
	/* Base64 of something wrapping the secret at each alignment ("Bearer ...", "user:..."). */
	for (k = 0; k < 3; k++) {
		char pre[4] = "abc";
		size_t i;

		pre[k] = '\0';
		snprintf(wrapped, sizeof(wrapped), "%sBearer %s!", pre, secret);
		b64_encode((const uint8_t *)wrapped, strlen(wrapped), enc);
		out = scrub_str(&s, enc);
		assert_non_null(strstr(out, "[REDACTED]"));
		/* At most 2 characters on each side of the core are left of the secret's span. */
		i = strlen(enc) - (strlen(out) - (sizeof(SCRUB_REPLACEMENT) - 1));
		assert_true(i >= (strlen(secret) * 8) / 6 - 2);
		free(out);
	}
	/* Nothing to scrub: unchanged, binary-safe. */
	{
		const char bin[] = "a\0b\0c";
		size_t n;

		out = scrub_apply(&s, bin, sizeof(bin), &n);
		assert_int_equal(n, sizeof(bin));
		assert_memory_equal(out, bin, n);
		free(out);
	}
	scrub_free(&s);
	/* A secret split across two header lines is scrubbed per line: each half is harmless
	 * alone, and the broker buffers whole bodies so bodies are never split. */
	assert_int_equal(scrub_add(&s, "abcdefgh", 8), 0);
	out = scrub_str(&s, "xxabcdefghabcdefgh");
	assert_string_equal(out, "xx[REDACTED][REDACTED]");
	free(out);
	scrub_free(&s);
}

static void test_scrub_b64_cores(void **state)
{
	const char *secret = "correct horse battery staple";
	struct scrubber s = {0};
	char buf[256], enc[512], *out;
	unsigned k;

	(void)state;
	assert_int_equal(scrub_add(&s, secret, strlen(secret)), 0);
	/* Every alignment of the secret inside a longer base64 stream loses the core. */
	for (k = 0; k < 3; k++) {
		size_t removed;

		memset(buf, 'Z', sizeof(buf));
		memcpy(buf + 10 + k, secret, strlen(secret));
		b64_encode((const uint8_t *)buf, 60, enc);
		out = scrub_str(&s, enc);
		assert_non_null(strstr(out, "[REDACTED]"));
		/* The removed run covers all but at most one character at each end of the
		 * secret's 8*len/6 characters. */
		removed = strlen(enc) - (strlen(out) - (sizeof(SCRUB_REPLACEMENT) - 1));
		assert_true(removed + 2 >= strlen(secret) * 8 / 6);
		/* And the surroundings are untouched. */
		assert_memory_equal(out, enc, 12);
		free(out);
	}
	scrub_free(&s);
}

/* The encodings a server may echo a secret in besides raw and standard base64. */
static void test_scrub_encodings(void **state)
{
	const char *secret = "s3cr/t+K3y?~x=y&\"z\"";
	struct scrubber s = {0};
	char enc[128], in[256];
	size_t i;

	(void)state;
	assert_int_equal(scrub_add(&s, secret, strlen(secret)), 0);
	/* base64url, with and without padding. */
	b64_encode((const uint8_t *)secret, strlen(secret), enc);
	for (i = 0; enc[i]; i++)
		enc[i] = enc[i] == '+' ? '-' : enc[i] == '/' ? '_' : enc[i];
	assert_non_null(strpbrk(enc, "-_"));
	snprintf(in, sizeof(in), "t=%s;", enc);
	scrubs_to(&s, in, "t=[REDACTED];");
	enc[strcspn(enc, "=")] = '\0';
	snprintf(in, sizeof(in), "t=%s;", enc);
	scrubs_to(&s, in, "t=[REDACTED];");
	/* base64url of "Bearer <secret>" (the core inside a longer stream). */
	snprintf(in, sizeof(in), "Bearer %s", secret);
	b64_encode((const uint8_t *)in, strlen(in), enc);
	for (i = 0; enc[i]; i++)
		enc[i] = enc[i] == '+' ? '-' : enc[i] == '/' ? '_' : enc[i];
	{
		char *out = scrub_str(&s, enc);

		assert_non_null(strstr(out, "[REDACTED]"));
		assert_true(strlen(out) < strlen(enc) - strlen(secret) + 10);
		free(out);
	}
	/* Percent-encoding: encodeURIComponent, every byte, lower-case hex, form '+'. */
	scrubs_to(&s, "q=s3cr%2Ft%2BK3y%3F~x%3Dy%26%22z%22&", "q=[REDACTED]&");
	scrubs_to(&s, "%73%33%63%72%2f%74%2b%4b%33%79%3f%7e%78%3d%79%26%22%7a%22", "[REDACTED]");
	scrubs_to(&s, "<%73%33%63%72%2F%74%2B%4B%33%79%3F%7E%78%3D%79%26%22%7A%22>",
		  "<[REDACTED]>");
	/* JSON escapes: "\/", "\"", and \u forms (any case). */
	scrubs_to(&s, "{\"t\":\"s3cr\\/t+K3y?~x=y&\\\"z\\\"\"}", "{\"t\":\"[REDACTED]\"}");
	scrubs_to(&s,
		  "\"\\u0073\\u0033cr\\u002Ft\\u002bK3y\\u003f~x\\u003dy\\u0026\\u0022z\\u0022\"",
		  "\"[REDACTED]\"");
	/* Hex, lower and upper case. */
	scrubs_to(&s, "h=733363722f742b4b33793f7e783d7926227a22.", "h=[REDACTED].");
	scrubs_to(&s, "h=733363722F742B4B33793F7E783D7926227A22.", "h=[REDACTED].");
	/* Unrelated escapes are left alone. */
	scrubs_to(&s, "a%20b \\u0041 %zz \\", "a%20b \\u0041 %zz \\");
	scrub_free(&s);
	/* A non-ASCII secret written as JSON \u escapes (BMP and a surrogate pair). */
	assert_int_equal(scrub_add(&s, "p\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80q", 11), 0);
	scrubs_to(&s, "x\"p\\u00e9\\u20AC\\ud83d\\ude00q\"", "x\"[REDACTED]\"");
	scrub_free(&s);
	/* A literal '%' or '+' in the secret is found raw and encoded. */
	assert_int_equal(scrub_add(&s, "a%25b+c d", 9), 0);
	scrubs_to(&s, "[a%25b+c d]", "[[REDACTED]]");
	scrubs_to(&s, "[a%2525b%2Bc+d]", "[[REDACTED]]");
	scrub_free(&s);
}

/* Issue 27: what a reflecting server plausibly makes of a secret besides the encodings above:
 * HTML character references (decimal, hex, named), a change of letter case, one character per
 * line (or wrapped base64). Separators are bounded and never taken around an occurrence. */
static void test_scrub_reflections(void **state)
{
	const char *secret = "Ab1&x\"<y>'Q";
	struct scrubber s = {0};
	char enc[128], in[512];
	size_t i, o;

	(void)state;
	assert_int_equal(scrub_add(&s, secret, strlen(secret)), 0);
	/* html.escape / htmlspecialchars / Go's html.EscapeString. */
	scrubs_to(&s, "<p>Ab1&amp;x&quot;&lt;y&gt;&#x27;Q</p>", "<p>[REDACTED]</p>");
	scrubs_to(&s, "<p>Ab1&amp;x&#34;&lt;y&gt;&#39;Q</p>", "<p>[REDACTED]</p>");
	scrubs_to(&s, "v=\"Ab1&amp;x&quot;&lt;y&gt;&#039;Q\"", "v=\"[REDACTED]\"");
	/* Every character as a numeric reference, hex and decimal, any case, ';' optional. */
	scrubs_to(&s, "&#x41;&#x62;&#x31;&#x26;&#x78;&#x22;&#x3C;&#x79;&#x3e;&#x27;&#x51;",
		  "[REDACTED]");
	scrubs_to(&s, "&#65;&#98;&#49;&#38;&#120;&#34;&#60;&#121;&#62;&#39;&#81;.", "[REDACTED].");
	scrubs_to(&s, "&#X41&#0098;1&AMP;x&QUOT;&LT;y&GT;&apos;Q", "[REDACTED]");
	/* Upper- and lower-cased. */
	scrubs_to(&s, "ERROR: BAD TOKEN AB1&X\"<Y>'Q!", "ERROR: BAD TOKEN [REDACTED]!");
	scrubs_to(&s, "bad token ab1&x\"<y>'q", "bad token [REDACTED]");
	scrubs_to(&s, "AB1&AMP;X&QUOT;&LT;Y&GT;&#X27;Q", "[REDACTED]");
	/* One character per line: LF, CRLF, <br>, escaped newlines in JSON. */
	for (i = o = 0; secret[i]; i++) {
		in[o++] = secret[i];
		in[o++] = '\n';
	}
	in[o] = '\0';
	scrubs_to(&s, in, "[REDACTED]\n");
	for (i = o = 0; secret[i]; i++)
		o += (size_t)snprintf(in + o, sizeof(in) - o, "%c\r\n", secret[i]);
	scrubs_to(&s, in, "[REDACTED]\r\n");
	scrubs_to(&s,
		  "A<br>b<br/>1<BR />&amp;<br>x<br>&quot;<br>&lt;<br>y<br>&gt;<br>&#39;<br>Q<br>",
		  "[REDACTED]<br>");
	scrubs_to(&s, "[\"A\\nb\\n1\\n&\\nx\\n\\\"\\n<\\ny\\n>\\n'\\nQ\"]", "[\"[REDACTED]\"]");
	scrubs_to(&s, "A b 1 & x \" < y > ' Q", "[REDACTED]");
	/* Too much between two characters is not one occurrence; what surrounds one is kept. */
	scrubs_to(&s, "Ab1&x\"<y>'\n\n\n\n\n\n\n\n\nQ", "Ab1&x\"<y>'\n\n\n\n\n\n\n\n\nQ");
	scrubs_to(&s, "\n\nAb1&x\"<y>'Q\n\n", "\n\n[REDACTED]\n\n");
	scrub_free(&s);
	/* Base64 wrapped at 76 columns (MIME, PEM-like) is found across the line breaks. */
	{
		const char *long_secret = "0123456789abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJ"
					  "KLMNOPQRSTUVWXYZ-long";
		char *out;

		assert_int_equal(scrub_add(&s, long_secret, strlen(long_secret)), 0);
		b64_encode((const uint8_t *)long_secret, strlen(long_secret), enc);
		assert_true(strlen(enc) > 76);
		snprintf(in, sizeof(in), "%.76s\r\n%s\r\n", enc, enc + 76);
		out = scrub_str(&s, in);
		if (strcmp(out, "[REDACTED]\r\n"))
			fail_msg("wrapped base64: \"%s\"", out);
		free(out);
		scrub_free(&s);
	}
	/* Hex upper- or mixed-case, the same pattern. */
	assert_int_equal(scrub_add(&s, "k3y!", 4), 0);
	scrubs_to(&s, "6B337921 6b337921 6B33 7921", "[REDACTED] [REDACTED] [REDACTED]");
	/* Unrelated references are left alone. */
	scrubs_to(&s, "&amp; &#x41; &#65 &nosuch; &#xZZ;", "&amp; &#x41; &#65 &nosuch; &#xZZ;");
	scrub_free(&s);
}

/* The record of a GET by credential "demo" the policy refused. */
static struct audit_rec denied_get(uint64_t epoch, const char *url)
{
	return (struct audit_rec){.epoch = epoch,
				  .credential = "demo",
				  .method = "GET",
				  .url = url,
				  .decision = "deny",
				  .reason = "host not allowed"};
}

static const char *tmp_audit(char *path)
{
	int fd = mkstemp(path);

	assert_true(fd >= 0);
	close(fd);
	return path;
}

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf = malloc(8 << 20);

	assert_non_null(f);
	assert_non_null(buf);
	*len = fread(buf, 1, (8 << 20) - 1, f);
	buf[*len] = '\0';
	fclose(f);
	return buf;
}

/* Writes lines 2..n of a log again with a forged reason on line 2, each line chained to the one
 * before by recomputed unkeyed hashes (what anyone who can write the file can do), with a MAC
 * under fake_key or none. Returns the new log (line 1 kept as is). */
static char *forge(const char *buf, const struct audit_rec *r, int n, const uint8_t *fake_key,
		   size_t *outlen)
{
	const char *l2 = strchr(buf, '\n') + 1;
	char *out = malloc(1 << 16), prev[65];
	size_t o = (size_t)(l2 - buf);
	int i;

	assert_non_null(out);
	memcpy(out, buf, o);
	audit_sha256_hex(buf, o - 1, prev);
	for (i = 2; i <= n; i++) {
		struct audit_rec f = *r;
		char *line;

		if (i == 2)
			f.reason = "forged: nothing happened here";
		line = audit_format(&f, (uint64_t)i, prev, "2026-01-01T00:00:00.000Z", fake_key);
		assert_non_null(line);
		audit_sha256_hex(line, strlen(line), prev);
		o += (size_t)sprintf(out + o, "%s\n", line);
		free(line);
	}
	*outlen = o;
	return out;
}

/* The MAC: a log rewritten with recomputed hashes passes the unkeyed chain check and fails the
 * keyed one; the key file is created 0600 and refused when others could read it. */
static void test_audit_mac(void **state)
{
	char dir[] = "/tmp/cbk-XXXXXX", kpath[64], lpath[64], other[64], why[256], err[256];
	uint8_t key[AUDIT_KEY_LEN], key2[AUDIT_KEY_LEN], fake[AUDIT_KEY_LEN];
	struct audit a;
	struct audit_rec r = denied_get(2, "http://h/v1/x");
	struct stat st;
	char *buf, *forged;
	size_t len, flen, nrec;
	int i, fd;

	(void)state;
	assert_non_null(mkdtemp(dir));
	snprintf(kpath, sizeof(kpath), "%s/policy.json.audit-key", dir);
	snprintf(lpath, sizeof(lpath), "%s/audit.jsonl", dir);
	snprintf(other, sizeof(other), "%s/other-key", dir);
	/* Created on first use, 0600; read back the same. */
	assert_int_equal(audit_key_load(kpath, false, key, err, sizeof(err)), -ENOENT);
	assert_int_equal(audit_key_load(kpath, true, key, err, sizeof(err)), 0);
	assert_int_equal(stat(kpath, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	assert_int_equal(audit_key_load(kpath, false, key2, err, sizeof(err)), 0);
	assert_memory_equal(key, key2, AUDIT_KEY_LEN);
	assert_int_equal(audit_key_load(other, true, fake, err, sizeof(err)), 0);
	assert_memory_not_equal(key, fake, AUDIT_KEY_LEN);

	assert_int_equal(audit_open(&a, lpath, key, err, sizeof(err)), 0);
	for (i = 0; i < 4; i++) {
		r.status = i;
		assert_int_equal(audit_append(&a, &r), 0);
	}
	audit_close(&a);
	buf = slurp(lpath, &len);
	assert_non_null(strstr(buf, "\",\"mac\":\""));
	assert_int_equal(audit_verify_buf(buf, len, key, &nrec, why, sizeof(why)), 0);
	assert_int_equal(nrec, 4);
	assert_int_equal(audit_verify_buf(buf, len, NULL, &nrec, why, sizeof(why)), 0);
	assert_int_equal(audit_verify_file(lpath, key, &nrec, why, sizeof(why)), 0);
	/* Under another key every line fails. */
	assert_int_equal(audit_verify_buf(buf, len, fake, &nrec, why, sizeof(why)), 1);

	/* Line 2 rewritten, hashes recomputed, no MAC: the unkeyed chain verifies, the key does
	 * not. */
	forged = forge(buf, &r, 4, NULL, &flen);
	assert_int_equal(audit_verify_buf(forged, flen, NULL, &nrec, why, sizeof(why)), 0);
	assert_int_equal(audit_verify_buf(forged, flen, key, &nrec, why, sizeof(why)), 2);
	assert_non_null(strstr(why, "mac"));
	free(forged);
	/* ... with a MAC under a key of the forger's own. */
	forged = forge(buf, &r, 4, fake, &flen);
	assert_int_equal(audit_verify_buf(forged, flen, NULL, &nrec, why, sizeof(why)), 0);
	assert_int_equal(audit_verify_buf(forged, flen, key, &nrec, why, sizeof(why)), 2);
	assert_non_null(strstr(why, "mac does not match"));
	/* A broker with the real key refuses to continue the forged log. */
	fd = open(lpath, O_WRONLY | O_TRUNC);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, forged, flen), (ssize_t)flen);
	close(fd);
	assert_int_equal(audit_open(&a, lpath, key, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "mac does not match"));
	free(forged);
	/* A log written without a key is refused by a keyed broker, with one line. */
	unlink(lpath);
	assert_int_equal(audit_open(&a, lpath, NULL, err, sizeof(err)), 0);
	assert_int_equal(audit_append(&a, &r), 0);
	audit_close(&a);
	assert_int_equal(audit_open(&a, lpath, key, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "no \"mac\" field"));
	assert_null(strchr(err, '\n'));

	/* The key file must be ours, 0600, not a link, 64 hex digits. */
	assert_int_equal(chmod(kpath, 0640), 0);
	assert_int_equal(audit_key_load(kpath, true, key2, err, sizeof(err)), -EPERM);
	assert_int_equal(chmod(kpath, 0600), 0);
	unlink(other);
	assert_int_equal(symlink(kpath, other), 0);
	assert_int_equal(audit_key_load(other, true, key2, err, sizeof(err)), -ELOOP);
	unlink(other);
	fd = open(other, O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "abc\n", 4), 4);
	close(fd);
	assert_int_equal(audit_key_load(other, true, key2, err, sizeof(err)), -EINVAL);

	free(buf);
	unlink(other);
	unlink(kpath);
	unlink(lpath);
	rmdir(dir);
}

static void test_audit_chain(void **state)
{
	char path[] = "/tmp/cba-XXXXXX", why[256], err[256], *buf, *copy, *l2, *l3;
	struct audit a;
	struct audit_rec r = denied_get(4, "http://h/v1/\x01\"q");
	size_t len, nrec;
	int i;

	(void)state;
	tmp_audit(path);
	assert_int_equal(audit_open(&a, path, NULL, err, sizeof(err)), 0);
	for (i = 0; i < 4; i++) {
		r.status = i;
		assert_int_equal(audit_append(&a, &r), 0);
	}
	audit_close(&a);
	/* Reopening continues the chain. */
	assert_int_equal(audit_open(&a, path, NULL, err, sizeof(err)), 0);
	assert_int_equal(a.seq, 4);
	r.decision = "allow";
	r.reason = "ok";
	assert_int_equal(audit_append(&a, &r), 0);
	audit_close(&a);
	buf = slurp(path, &len);
	assert_int_equal(audit_verify_buf(buf, len, NULL, &nrec, why, sizeof(why)), 0);
	assert_int_equal(nrec, 5);
	assert_non_null(strstr(buf, "\"seq\":1,\"epoch\":4,\"credential\":\"demo\""));
	assert_non_null(strstr(buf, "\"url\":\"http://h/v1/?\\\"q\""));
	assert_non_null(strstr(buf, "\"prev\":\"0000000000000000"));
	assert_int_equal(audit_verify_file(path, NULL, &nrec, why, sizeof(why)), 0);

	copy = malloc(len + 1);
	assert_non_null(copy);
	l2 = strchr(buf, '\n') + 1;
	l3 = strchr(l2, '\n') + 1;
	/* Tampered: one byte of line 2 changed. */
	memcpy(copy, buf, len);
	copy[(l2 - buf) + 30] ^= 1;
	assert_int_equal(audit_verify_buf(copy, len, NULL, &nrec, why, sizeof(why)), 2);
	assert_non_null(strstr(why, "hash"));
	assert_int_equal(nrec, 1);
	/* Line 2 rewritten with a valid own hash: the next line's prev no longer matches. */
	{
		char *re, prev[65];
		struct audit_rec r2 = r;

		audit_sha256_hex(buf, (size_t)(l2 - buf - 1), prev);
		r2.reason = "forged";
		r2.status = 1;
		re = audit_format(&r2, 2, prev, "2026-01-01T00:00:00.000Z", NULL);
		assert_non_null(re);
		len = (size_t)sprintf(copy, "%.*s%s\n%s", (int)(l2 - buf), buf, re, l3);
		assert_int_equal(audit_verify_buf(copy, len, NULL, &nrec, why, sizeof(why)), 3);
		assert_non_null(strstr(why, "prev"));
		free(re);
	}
	/* Deleted line 2. */
	len = (size_t)sprintf(copy, "%.*s%s", (int)(l2 - buf), buf, l3);
	assert_int_equal(audit_verify_buf(copy, len, NULL, &nrec, why, sizeof(why)), 2);
	/* Swapped lines 2 and 3. */
	{
		char *l4 = strchr(l3, '\n') + 1;

		len = (size_t)sprintf(copy, "%.*s%.*s%.*s%s", (int)(l2 - buf), buf, (int)(l4 - l3),
				      l3, (int)(l3 - l2), l2, l4);
		assert_int_equal(audit_verify_buf(copy, len, NULL, &nrec, why, sizeof(why)), 2);
	}
	/* Torn last line, junk line, empty log. */
	len = strlen(buf);
	assert_int_equal(audit_verify_buf(buf, len - 1, NULL, &nrec, why, sizeof(why)), 5);
	assert_int_equal(audit_verify_buf("junk\n", 5, NULL, &nrec, why, sizeof(why)), 1);
	assert_int_equal(audit_verify_buf("", 0, NULL, &nrec, why, sizeof(why)), 0);
	assert_int_equal(nrec, 0);
	free(copy);
	free(buf);
	unlink(path);
}

/* The whole guest handler on malformed input: an error reply and an audit line, never a crash. */
static void test_handle_malformed(void **state)
{
	char path[] = "/tmp/cbh-XXXXXX", err[256], why[256], *reply, *buf;
	static const char pol[] = "{\"credentials\":{\"demo\":{\"helper\":[\"/bin/false\"],"
				  "\"inject\":{\"header\":\"Authorization\",\"template\":"
				  "\"Bearer {password}\"},\"allow\":{\"hosts\":[\"h.example\"]}}}}";
	const char *msgs[] = {
	    "",
	    "{",
	    "[]",
	    "null",
	    "{\"v\":1}",
	    "{\"v\":1,\"url\":3}",
	    "{\"v\":1,\"epoch\":\"1\",\"url\":\"u\"}",
	    "{\"v\":1,\"url\":\"u\",\"headers\":{}}",
	    "{\"v\":1,\"url\":\"https://h.example/\"}", /* no token: stale epoch */
	};
	struct broker b = {
	    .epoch = 2, .have_token = true, .helper_timeout_ms = 1000, .fetch_timeout_s = 5};
	size_t i, rlen, len, nrec;

	(void)state;
	memset(b.token, 0xab, sizeof(b.token));
	assert_int_equal(policy_parse(pol, strlen(pol), &b.pol, err, sizeof(err)), 0);
	tmp_audit(path);
	assert_int_equal(audit_open(&b.audit, path, NULL, err, sizeof(err)), 0);
	for (i = 0; i < sizeof(msgs) / sizeof(msgs[0]); i++) {
		assert_int_equal(broker_handle_guest(&b, (const uint8_t *)msgs[i], strlen(msgs[i]),
						     &reply, &rlen),
				 0);
		assert_non_null(strstr(reply, "\"ok\":false"));
		assert_non_null(strstr(reply, i + 1 < sizeof(msgs) / sizeof(msgs[0])
						  ? "denied: malformed request"
						  : "denied: stale epoch"));
		free(reply);
	}
	/* Binary garbage. */
	{
		uint8_t junk[300];

		for (i = 0; i < sizeof(junk); i++)
			junk[i] = (uint8_t)(i * 37 + 11);
		assert_int_equal(broker_handle_guest(&b, junk, sizeof(junk), &reply, &rlen), 0);
		assert_non_null(strstr(reply, "malformed request"));
		free(reply);
	}
	assert_int_equal(broker_reject_frame(&b, "frame over 1 MiB", &reply, &rlen), 0);
	assert_string_equal(reply, "{\"ok\":false,\"error\":\"denied: malformed request: frame "
				   "over 1 MiB\"}");
	free(reply);
	/* The control channel. */
	assert_int_equal(
	    broker_handle_ctl(&b, (const uint8_t *)"{\"op\":\"grant\"}", 14, &reply, &rlen), 0);
	assert_non_null(strstr(reply, "\"epoch\":3"));
	free(reply);
	assert_int_equal(broker_handle_ctl(&b, (const uint8_t *)"{]", 2, &reply, &rlen), 0);
	assert_non_null(strstr(reply, "\"ok\":false"));
	free(reply);
	audit_close(&b.audit);
	buf = slurp(path, &len);
	assert_int_equal(audit_verify_buf(buf, len, NULL, &nrec, why, sizeof(why)), 0);
	assert_int_equal(nrec, sizeof(msgs) / sizeof(msgs[0]) + 2);
	free(buf);
	unlink(path);
	policy_free(&b.pol);
}

/* Random mutations of a valid request: every one gets an error reply, none crashes. */
static void test_handle_fuzz(void **state)
{
	char path[] = "/dev/shm/cbf-XXXXXX", err[256], why[256], *reply, *buf;
	static const char pol[] = "{\"credentials\":{\"demo\":{\"helper\":[\"/bin/false\"],"
				  "\"inject\":{\"header\":\"Authorization\",\"template\":"
				  "\"Bearer {password}\"},\"allow\":{\"hosts\":[\"127.0.0.1\"],"
				  "\"schemes\":[\"http\"],\"ports\":[9],\"methods\":[\"GET\","
				  "\"POST\"]}}}}";
	static const char base[] =
	    "{\"v\":1,\"epoch\":2,\"token\":\"abababababababababababababababab\","
	    "\"credential\":\"demo\",\"method\":\"POST\",\"url\":\"http://127.0.0.1:9/x\","
	    "\"headers\":[\"Accept: */*\",\"User-Agent: b\"],\"body_b64\":\"aGVsbG8=\"}";
	struct broker b = {.epoch = 2, .have_token = true, .helper_timeout_ms = 1000};
	uint8_t msg[sizeof(base) + 64];
	size_t i, rlen, len, nrec;
	unsigned seed = 12345;
	int fd;

	(void)state;
	memset(b.token, 0xab, sizeof(b.token));
	assert_int_equal(policy_parse(pol, strlen(pol), &b.pol, err, sizeof(err)), 0);
	fd = mkstemp(path);
	if (fd < 0) { /* no /dev/shm: use /tmp */
		strcpy(path, "/tmp/cbf-XXXXXX");
		fd = mkstemp(path);
	}
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(audit_open(&b.audit, path, NULL, err, sizeof(err)), 0);
	for (i = 0; i < 3000; i++) {
		size_t n = sizeof(base) - 1, k, edits = 1 + rand_r(&seed) % 4;

		memcpy(msg, base, n);
		for (k = 0; k < edits && n > 1; k++) {
			size_t at = (size_t)rand_r(&seed) % n;

			switch (rand_r(&seed) % 4) {
			case 0:
				msg[at] ^= (uint8_t)(1 << rand_r(&seed) % 8);
				break;
			case 1:
				msg[at] = (uint8_t)rand_r(&seed);
				break;
			case 2:
				memmove(msg + at, msg + at + 1, n - at - 1);
				n--;
				break;
			default:
				n = at;
				break;
			}
		}
		assert_int_equal(broker_handle_guest(&b, msg, n, &reply, &rlen), 0);
		assert_non_null(reply);
		assert_int_equal(strlen(reply), rlen);
		assert_non_null(strstr(reply, "\"ok\":false"));
		free(reply);
	}
	/* The unmutated request is allowed by the policy and stopped at the destination check. */
	assert_int_equal(
	    broker_handle_guest(&b, (const uint8_t *)base, strlen(base), &reply, &rlen), 0);
	assert_string_equal(reply, "{\"ok\":false,\"error\":\"denied: private destination\"}");
	free(reply);
	audit_close(&b.audit);
	buf = slurp(path, &len);
	assert_int_equal(audit_verify_buf(buf, len, NULL, &nrec, why, sizeof(why)), 0);
	assert_int_equal(nrec, 3001);
	free(buf);
	unlink(path);
	policy_free(&b.pol);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_frame),
	    cmocka_unit_test(test_b64),
	    cmocka_unit_test(test_request_parse),
	    cmocka_unit_test(test_request_huge),

	    cmocka_unit_test(test_helper_parse),
	    cmocka_unit_test(test_helper_run),
	    cmocka_unit_test(test_scrub),
	    cmocka_unit_test(test_scrub_b64_cores),
	    cmocka_unit_test(test_scrub_encodings),
	    cmocka_unit_test(test_scrub_reflections),
	    cmocka_unit_test(test_audit_chain),
	    cmocka_unit_test(test_audit_mac),
	    cmocka_unit_test(test_handle_malformed),
	    cmocka_unit_test(test_handle_fuzz),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
