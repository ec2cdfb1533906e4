/* The store client's pure parts, no server: store.json and credentials files, the probe's
 * verdict, URLs and keys, the retry policy, and S3's XML replies (hostile ones included). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "lifecycle/store/s3_internal.h"
#include "lifecycle/store/store_config.h"
#include "lifecycle/store/store_probe.h"

#include <errno.h>
#include <fcntl.h>
#include <libxml/parser.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct store_env ENV = {"AKID", "SECRET", NULL};

static int parse(const char *json, const struct store_env *env, struct store_config *cfg, char *err,
		 size_t errlen)
{
	return store_config_parse(json, strlen(json), env, cfg, err, errlen);
}

static void test_config_ok(void **state)
{
	(void)state;
	struct store_config cfg;
	char err[300];
	assert_int_equal(parse("{\"endpoint\":\"https://s3.example:9000/\",\"bucket\":\"cove-b\","
			       "\"prefix\":\"fleet/\",\"region\":\"eu-west-1\",\"ca_file\":\"/etc/"
			       "ca.pem\",\"addressing\":\"virtual\"}",
			       &ENV, &cfg, err, sizeof(err)),
			 0);
	assert_string_equal(cfg.endpoint, "https://s3.example:9000");
	assert_string_equal(cfg.bucket, "cove-b");
	assert_string_equal(cfg.prefix, "fleet/");
	assert_string_equal(cfg.region, "eu-west-1");
	assert_int_equal(cfg.addressing, STORE_ADDR_VIRTUAL);
	assert_string_equal(cfg.access_key_id, "AKID");
	assert_string_equal(cfg.secret_access_key, "SECRET");
	store_config_wipe(&cfg);
	assert_string_equal(cfg.secret_access_key, "");
	/* defaults: path-style, us-east-1 */
	assert_int_equal(
	    parse("{\"endpoint\":\"https://h\",\"bucket\":\"abc\"}", &ENV, &cfg, err, sizeof(err)),
	    0);
	assert_int_equal(cfg.addressing, STORE_ADDR_PATH);
	assert_string_equal(cfg.region, "us-east-1");
}

static void expect_refused(const char *json, int code, const char *needle)
{
	struct store_config cfg;
	char err[300] = "";
	int r = parse(json, &ENV, &cfg, err, sizeof(err));
	if (r != code || !strstr(err, needle))
		fail_msg("%s: got %d \"%s\", wanted %d with \"%s\"", json, r, err, code, needle);
	assert_null(strchr(err, '\n'));
	assert_string_equal(cfg.secret_access_key, "");
}

static void test_config_refused(void **state)
{
	(void)state;
	expect_refused("{\"endpoint\":\"https://h\",\"bucket\":\"abc\",\"colour\":1}", -EINVAL,
		       "unknown key \"colour\"");
	char big[STORE_CONFIG_MAX + 100];
	memset(big, ' ', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	expect_refused(big, -EFBIG, "at most");
	char json[1200];
	char longp[STORE_PREFIX_MAX + 2];
	memset(longp, 'p', sizeof(longp) - 1);
	longp[sizeof(longp) - 1] = '\0';
	snprintf(json, sizeof(json),
		 "{\"endpoint\":\"https://h\",\"bucket\":\"abc\",\"prefix\":\"%s\"}", longp);
	expect_refused(json, -ENAMETOOLONG, "\"prefix\" is 257 bytes");
	expect_refused("{\"endpoint\":\"http://h\",\"bucket\":\"abc\"}", -EPERM, "TLS is required");
	expect_refused("{\"endpoint\":\"ftp://h\",\"bucket\":\"abc\"}", -EINVAL, "https://");
	expect_refused("{\"endpoint\":\"https://h/path\",\"bucket\":\"abc\"}", -EINVAL,
		       "scheme://host");
	expect_refused("{\"endpoint\":\"https://u@h\",\"bucket\":\"abc\"}", -EINVAL,
		       "scheme://host");
	expect_refused("{\"endpoint\":\"https://h\",\"bucket\":\"AB\"}", -EINVAL, "bucket");
	expect_refused("{\"endpoint\":\"https://h\",\"bucket\":\"abc\",\"region\":\"US East\"}",
		       -EINVAL, "region");
	expect_refused("{\"endpoint\":\"https://h\",\"bucket\":\"abc\",\"addressing\":\"x\"}",
		       -EINVAL, "addressing");
	expect_refused("{\"endpoint\":\"https://h\",\"bucket\":\"abc\",\"ca_file\":\"rel.pem\"}",
		       -EINVAL, "absolute");
	expect_refused("{\"endpoint\":\"https://h\",\"bucket\":\"abc\",\"insecure_http\":1}",
		       -EINVAL, "true or false");
	expect_refused("{\"endpoint\":\"https://h\"}", -EINVAL, "needs");
	expect_refused("[1]", -EINVAL, "not a JSON object");
	expect_refused("{\"endpoint\":\"https://h\",\"bucket\":\"abc\",\"bucket\":\"abd\"}",
		       -EINVAL, "duplicate");
	/* http only when said explicitly */
	struct store_config cfg;
	char err[300];
	assert_int_equal(parse("{\"endpoint\":\"http://h:80\",\"bucket\":\"abc\","
			       "\"insecure_http\":true}",
			       &ENV, &cfg, err, sizeof(err)),
			 0);
	/* no credentials anywhere */
	struct store_env none = {0};
	assert_int_equal(
	    parse("{\"endpoint\":\"https://h\",\"bucket\":\"abc\"}", &none, &cfg, err, sizeof(err)),
	    -ENOKEY);
	assert_non_null(strstr(err, "AWS_ACCESS_KEY_ID"));
}

static void cred_file(const char *dir, const char *name, mode_t mode, const char *text, char *path)
{
	sprintf(path, "%s/%s", dir, name);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	assert_int_equal(fchmod(fd, mode), 0);
	close(fd);
}

static void test_credentials_file(void **state)
{
	(void)state;
	char dir[] = "/tmp/cove-store-unit.XXXXXX", p[256], json[600], err[300];
	assert_non_null(mkdtemp(dir));
	struct store_config cfg;
	const char *creds = "{\"access_key_id\":\"FILEKEY\",\"secret_access_key\":\"FILESECRET\","
			    "\"session_token\":\"TOK\"}";
	cred_file(dir, "good", 0600, creds, p);
	snprintf(json, sizeof(json),
		 "{\"endpoint\":\"https://h\",\"bucket\":\"abc\",\"credentials_file\":\"%s\"}", p);
	assert_int_equal(parse(json, &ENV, &cfg, err, sizeof(err)), 0);
	assert_string_equal(cfg.access_key_id, "FILEKEY"); /* the file wins over the variables */
	assert_string_equal(cfg.session_token, "TOK");

	cred_file(dir, "open", 0644, creds, p);
	snprintf(json, sizeof(json),
		 "{\"endpoint\":\"https://h\",\"bucket\":\"abc\",\"credentials_file\":\"%s\"}", p);
	assert_int_equal(parse(json, &ENV, &cfg, err, sizeof(err)), -EPERM);
	assert_non_null(strstr(err, "mode 0644"));
	assert_null(strchr(err, '\n'));

	cred_file(dir, "group", 0640, creds, p);
	assert_int_equal(store_cred_file_read(p, &cfg, err, sizeof(err)), -EPERM);

	char link[300];
	snprintf(link, sizeof(link), "%s/link", dir);
	char good[300];
	snprintf(good, sizeof(good), "%s/good", dir);
	assert_int_equal(symlink(good, link), 0);
	assert_int_equal(store_cred_file_read(link, &cfg, err, sizeof(err)), -ELOOP);

	cred_file(dir, "unknown", 0600,
		  "{\"access_key_id\":\"a\",\"secret_access_key\":\"b\",\"x\":1}", p);
	assert_int_equal(store_cred_file_read(p, &cfg, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "unknown key"));

	cred_file(dir, "nosecret", 0600, "{\"access_key_id\":\"a\"}", p);
	assert_int_equal(store_cred_file_read(p, &cfg, err, sizeof(err)), -EINVAL);

	/* a parse error must not quote the secret */
	cred_file(dir, "broken", 0600, "{\"secret_access_key\":\"TOPSECRET\" oops", p);
	assert_int_equal(store_cred_file_read(p, &cfg, err, sizeof(err)), -EINVAL);
	assert_null(strstr(err, "TOPSECRET"));

	char *bigc = malloc(STORE_CRED_FILE_MAX + 10);
	memset(bigc, ' ', STORE_CRED_FILE_MAX + 9);
	bigc[STORE_CRED_FILE_MAX + 9] = '\0';
	cred_file(dir, "big", 0600, bigc, p);
	free(bigc);
	assert_int_equal(store_cred_file_read(p, &cfg, err, sizeof(err)), -EFBIG);

	const char *names[] = {"good",	  "open",     "group",	"link",
			       "unknown", "nosecret", "broken", "big"};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
		unlink(p);
	}
	rmdir(dir);
}

/* The host's side: fleet key file, key providers per type, policies per id. */
static void test_host_fields(void **state)
{
	(void)state;
	char dir[] = "/tmp/cove-fleet-XXXXXX", kp[256], json[1024], err[300];
	assert_non_null(mkdtemp(dir));
	const char *hex = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n";
	cred_file(dir, "fleet.key", 0600, hex, kp);
	struct store_config cfg;
	snprintf(json, sizeof(json),
		 "{\"endpoint\":\"https://h\",\"bucket\":\"abc\",\"fleet_key_file\":\"%s\","
		 "\"key_providers\":{\"pkcs11\":\"pkcs11:token=cove;object=kek\"},"
		 "\"policies\":{\"default\":\"/etc/cove/policy.json\"}}",
		 kp);
	assert_int_equal(parse(json, &ENV, &cfg, err, sizeof(err)), 0);
	assert_int_equal(cfg.fleet_key_len, 32);
	assert_int_equal(cfg.fleet_key[31], 0x1f);
	assert_string_equal(cfg.pkcs11_spec, "pkcs11:token=cove;object=kek");
	assert_string_equal(cfg.key_cmd_spec, "");
	assert_int_equal(cfg.nr_policies, 1);
	assert_string_equal(cfg.policies[0].path, "/etc/cove/policy.json");
	store_config_wipe(&cfg);
	assert_int_equal(cfg.fleet_key_len, 0);
	/* A key file others can read, or not 64 hex digits: refused. */
	assert_int_equal(chmod(kp, 0644), 0);
	assert_int_equal(parse(json, &ENV, &cfg, err, sizeof(err)), -EPERM);
	assert_non_null(strstr(err, "mode 0600"));
	unlink(kp);
	cred_file(dir, "fleet.key", 0600, "abcd\n", kp);
	assert_int_equal(parse(json, &ENV, &cfg, err, sizeof(err)), -EINVAL);
	unlink(kp);
	rmdir(dir);
	expect_refused("{\"endpoint\":\"https://h\",\"bucket\":\"abc\",\"key_providers\":"
		       "{\"pkcs11\":\"key-cmd:/bin/sh\"}}",
		       -EINVAL, "must start with \"pkcs11:\"");
	expect_refused("{\"endpoint\":\"https://h\",\"bucket\":\"abc\",\"key_providers\":"
		       "{\"file\":\"x\"}}",
		       -EINVAL, "unknown type");
	expect_refused("{\"endpoint\":\"https://h\",\"bucket\":\"abc\",\"policies\":"
		       "{\"default\":\"policy.json\"}}",
		       -EINVAL, "must be absolute");
	expect_refused("{\"endpoint\":\"https://h\",\"bucket\":\"abc\",\"policies\":"
		       "{\"../x\":\"/p\"}}",
		       -EINVAL, "policy id");
}

/* "cache_max" (issue 29): a size string, checked like every other field. */
static void test_cache_max(void **state)
{
	(void)state;
	struct store_config cfg;
	char err[300];
	assert_int_equal(
	    parse("{\"endpoint\":\"https://h\",\"bucket\":\"abc\"}", &ENV, &cfg, err, sizeof(err)),
	    0);
	assert_int_equal(cfg.cache_max, 0); /* absent: no bound */
	assert_int_equal(
	    parse("{\"endpoint\":\"https://h\",\"bucket\":\"abc\",\"cache_max\":\"2G\"}", &ENV,
		  &cfg, err, sizeof(err)),
	    0);
	assert_int_equal(cfg.cache_max, 2ULL << 30);
	assert_int_equal(parse("{\"endpoint\":\"https://h\",\"bucket\":\"abc\",\"cache_max\":"
			       "\"512m\"}",
			       &ENV, &cfg, err, sizeof(err)),
			 0);
	assert_int_equal(cfg.cache_max, 512ULL << 20);
	expect_refused("{\"endpoint\":\"https://h\",\"bucket\":\"abc\",\"cache_max\":1024}",
		       -EINVAL, "\"cache_max\" must be a string");
	expect_refused("{\"endpoint\":\"https://h\",\"bucket\":\"abc\",\"cache_max\":\"2 G\"}",
		       -EINVAL, "at least 1M");
	expect_refused("{\"endpoint\":\"https://h\",\"bucket\":\"abc\",\"cache_max\":\"1K\"}",
		       -EINVAL, "at least 1M");
	expect_refused("{\"endpoint\":\"https://h\",\"bucket\":\"abc\",\"cache_max\":\"-1G\"}",
		       -EINVAL, "at least 1M");
	expect_refused("{\"endpoint\":\"https://h\",\"bucket\":\"abc\",\"cache_max\":"
		       "\"99999999999999999999\"}",
		       -EINVAL, "at least 1M");
	expect_refused("{\"endpoint\":\"https://h\",\"bucket\":\"abc\",\"cache_max\":"
		       "\"123456789012345678901234567890123\"}",
		       -ENAMETOOLONG, "\"cache_max\" is 33 bytes, at most 32");
	expect_refused("{\"endpoint\":\"https://h\",\"bucket\":\"abc\",\"cache_max\":\"1G\","
		       "\"cache_max\":\"2G\"}",
		       -EINVAL, "duplicate");
}

static void test_probe_decision(void **state)
{
	(void)state;
	char err[400];
	assert_int_equal(store_probe_decide(0, "", -EEXIST, "412", err, sizeof(err)), 0);
	/* Swift's s3api: 501 on the first conditional PUT */
	assert_int_equal(
	    store_probe_decide(-EOPNOTSUPP, "HTTP 501 NotImplemented", 0, "", err, sizeof(err)),
	    -EOPNOTSUPP);
	assert_non_null(strstr(err, "does not honour conditional create"));
	/* a store that overwrites */
	assert_int_equal(store_probe_decide(0, "", 0, "", err, sizeof(err)), -EOPNOTSUPP);
	assert_non_null(strstr(err, "does not honour conditional create"));
	/* a 400 to the second one */
	assert_int_equal(store_probe_decide(0, "", -EINVAL, "HTTP 400", err, sizeof(err)),
			 -EOPNOTSUPP);
	/* an unreachable store is not called non-conditional */
	assert_int_equal(store_probe_decide(-EIO, "connect failed", 0, "", err, sizeof(err)), -EIO);
	assert_null(strstr(err, "conditional create"));
	assert_int_equal(store_probe_decide(-EACCES, "HTTP 403", 0, "", err, sizeof(err)), -EACCES);
}

static void client_for(const char *json, struct s3_client **c)
{
	struct store_config cfg;
	char err[300];
	assert_int_equal(parse(json, &ENV, &cfg, err, sizeof(err)), 0);
	assert_int_equal(s3_client_new(&cfg, NULL, c, err, sizeof(err)), 0);
	store_config_wipe(&cfg);
}

static void test_urls(void **state)
{
	(void)state;
	struct s3_client *c;
	char url[S3_URL_MAX], full[S3_KEY_MAX + 1], err[200];
	client_for("{\"endpoint\":\"https://h:9000\",\"bucket\":\"bkt\",\"prefix\":\"p/\"}", &c);
	assert_int_equal(s3_full_key(c, "a b/c+d", full, sizeof(full), err, sizeof(err)), 0);
	assert_string_equal(full, "p/a b/c+d");
	assert_int_equal(s3_url(c, full, "uploads=", url, sizeof(url)), 0);
	assert_string_equal(url, "https://h:9000/bkt/p/a%20b/c%2Bd?uploads=");
	assert_int_equal(s3_full_key(c, "", full, sizeof(full), err, sizeof(err)), -EINVAL);
	assert_int_equal(s3_full_key(c, "a\nb", full, sizeof(full), err, sizeof(err)), -EINVAL);
	char *big = malloc(S3_KEY_MAX + 1);
	memset(big, 'k', S3_KEY_MAX);
	big[S3_KEY_MAX] = '\0';
	assert_int_equal(s3_full_key(c, big, full, sizeof(full), err, sizeof(err)), -ENAMETOOLONG);
	free(big);
	s3_client_free(c);
	client_for("{\"endpoint\":\"https://s3.example\",\"bucket\":\"bkt\","
		   "\"addressing\":\"virtual\"}",
		   &c);
	assert_int_equal(s3_url(c, "k/é", NULL, url, sizeof(url)), 0);
	assert_string_equal(url, "https://bkt.s3.example/k/%C3%A9");
	assert_int_equal(s3_url(c, NULL, "list-type=2", url, sizeof(url)), 0);
	assert_string_equal(url, "https://bkt.s3.example/?list-type=2");
	s3_client_free(c);
	char enc[16];
	assert_int_equal(s3_uri_encode("a/b", false, enc, sizeof(enc)), 0);
	assert_string_equal(enc, "a%2Fb");
	assert_int_equal(s3_uri_encode("//////", false, enc, sizeof(enc)), -ENAMETOOLONG);
}

static void test_retry_policy(void **state)
{
	(void)state;
	assert_true(s3_retryable(CURLE_OK, 500));
	assert_true(s3_retryable(CURLE_OK, 503));
	assert_true(s3_retryable(CURLE_OK, 429));
	assert_false(s3_retryable(CURLE_OK, 400));
	assert_false(s3_retryable(CURLE_OK, 403));
	assert_false(s3_retryable(CURLE_OK, 404));
	assert_false(s3_retryable(CURLE_OK, 412));
	assert_false(s3_retryable(CURLE_OK, 200));
	assert_true(s3_retryable(CURLE_COULDNT_CONNECT, 0));
	assert_true(s3_retryable(CURLE_RECV_ERROR, 0));
	assert_true(s3_retryable(CURLE_OPERATION_TIMEDOUT, 0));
	assert_false(s3_retryable(CURLE_PEER_FAILED_VERIFICATION, 0));
	assert_false(s3_retryable(CURLE_WRITE_ERROR, 0));
	uint64_t rng = 42;
	for (unsigned a = 1; a < 20; a++) {
		unsigned ceil = 100u << (a - 1 < 10 ? a - 1 : 10);
		if (ceil > 5000 || a > 10)
			ceil = 5000;
		for (int i = 0; i < 50; i++) {
			unsigned ms = s3_backoff_ms(a, 100, 5000, &rng);
			assert_true(ms >= ceil / 2 && ms <= ceil);
		}
	}
}

static void test_xml(void **state)
{
	(void)state;
	char code[64], err[300], id[S3_UPLOAD_ID_MAX + 1];
	const char *e = "<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code></Error>";
	assert_int_equal(s3_xml_error_code(e, strlen(e), code, sizeof(code)), 0);
	assert_string_equal(code, "NoSuchKey");
	assert_int_equal(s3_xml_error_code("garbage", 7, code, sizeof(code)), -EBADMSG);
	assert_string_equal(code, "");
	const char *init = "<InitiateMultipartUploadResult xmlns=\"http://s3.amazonaws.com/doc/"
			   "2006-03-01/\"><Bucket>b</Bucket><Key>k</Key><UploadId>2~abc</UploadId>"
			   "</InitiateMultipartUploadResult>";
	assert_int_equal(s3_xml_upload_id(init, strlen(init), id, sizeof(id), err, sizeof(err)), 0);
	assert_string_equal(id, "2~abc");
	const char *init_bad = "<InitiateMultipartUploadResult><UploadId>a b</UploadId>"
			       "</InitiateMultipartUploadResult>";
	assert_int_equal(
	    s3_xml_upload_id(init_bad, strlen(init_bad), id, sizeof(id), err, sizeof(err)),
	    -EBADMSG);
	/* an entity bomb is not expanded */
	const char *bomb = "<?xml version=\"1.0\"?><!DOCTYPE r [<!ENTITY a \"aaaaaaaaaa\">"
			   "<!ENTITY b \"&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;\">"
			   "<!ENTITY c \"&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;\">]>"
			   "<InitiateMultipartUploadResult><UploadId>&c;</UploadId>"
			   "</InitiateMultipartUploadResult>";
	assert_int_equal(s3_xml_upload_id(bomb, strlen(bomb), id, sizeof(id), err, sizeof(err)),
			 -EBADMSG);
	bool retry;
	const char *cerr = "<Error><Code>InternalError</Code></Error>";
	assert_int_equal(s3_xml_complete(cerr, strlen(cerr), &retry, err, sizeof(err)), -EIO);
	assert_true(retry);
	const char *cok = "<CompleteMultipartUploadResult><ETag></ETag>"
			  "</CompleteMultipartUploadResult>";
	assert_int_equal(s3_xml_complete(cok, strlen(cok), &retry, err, sizeof(err)), 0);

	struct s3_list_page p;
	const char *list = "<ListBucketResult><IsTruncated>true</IsTruncated>"
			   "<Contents><Key>p/a</Key><Size>12</Size><ETag>\"e\"</ETag></Contents>"
			   "<Contents><Key>p/b</Key><Size>0</Size></Contents>"
			   "<NextContinuationToken>tok</NextContinuationToken></ListBucketResult>";
	assert_int_equal(s3_xml_list_objects(list, strlen(list), 2, &p, err, sizeof(err)), 0);
	assert_int_equal(p.n, 2);
	assert_string_equal(p.entries[0].key, "p/a");
	assert_int_equal(p.entries[0].size, 12);
	assert_true(p.truncated);
	assert_string_equal(p.next_token, "tok");
	s3_list_page_free(&p);
	/* more entries than asked for */
	assert_int_equal(s3_xml_list_objects(list, strlen(list), 1, &p, err, sizeof(err)),
			 -EBADMSG);
	/* bad numbers, truncated without a token */
	const char *bad[] = {
	    "<ListBucketResult><Contents><Key>k</Key><Size>-1</Size></Contents></ListBucketResult>",
	    "<ListBucketResult><Contents><Key>k</Key><Size>99999999999999999999</Size></Contents>"
	    "</ListBucketResult>",
	    "<ListBucketResult><Contents><Size>1</Size></Contents></ListBucketResult>",
	    "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
	    "<ListBucketResult><IsTruncated>yes</IsTruncated></ListBucketResult>",
	    "<Other/>",
	    "<ListBucketResult><Contents><Key>k",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(
		    s3_xml_list_objects(bad[i], strlen(bad[i]), 10, &p, err, sizeof(err)),
		    -EBADMSG);
	struct s3_upload_entry ups[2];
	size_t n = 0;
	bool trunc;
	char nk[S3_KEY_MAX + 1], ni[S3_UPLOAD_ID_MAX + 1];
	const char *lu = "<ListMultipartUploadsResult><Upload><Key>k1</Key><UploadId>u1</UploadId>"
			 "</Upload><Upload><Key>k2</Key><UploadId>u2</UploadId></Upload>"
			 "<IsTruncated>false</IsTruncated></ListMultipartUploadsResult>";
	assert_int_equal(
	    s3_xml_list_uploads(lu, strlen(lu), 2, ups, &n, &trunc, nk, ni, err, sizeof(err)), 0);
	assert_int_equal(n, 2);
	assert_string_equal(ups[1].upload_id, "u2");
	n = 0;
	assert_int_equal(
	    s3_xml_list_uploads(lu, strlen(lu), 1, ups, &n, &trunc, nk, ni, err, sizeof(err)),
	    -E2BIG);
}

int main(void)
{
	xmlInitParser();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_config_ok),	     cmocka_unit_test(test_config_refused),
	    cmocka_unit_test(test_credentials_file), cmocka_unit_test(test_host_fields),
	    cmocka_unit_test(test_probe_decision),   cmocka_unit_test(test_urls),
	    cmocka_unit_test(test_retry_policy),     cmocka_unit_test(test_xml),
	    cmocka_unit_test(test_cache_max),
	};
	int r = cmocka_run_group_tests(tests, NULL, NULL);
	xmlCleanupParser();
	return r;
}
