/* The store client against a real Ceph radosgw over TLS (tests/lib/s3server.py starts it):
 * objects, listings, create-only PUTs, the probe, parallel multipart, a radosgw killed
 * mid-upload, TLS with the wrong CA, virtual-hosted addressing. No mock anywhere. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/log.h"
#include "lifecycle/store/s3.h"
#include "lifecycle/store/store_probe.h"

#include <curl/curl.h>
#include <errno.h>
#include <libxml/parser.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024u * 1024u)

struct fixture {
	struct store_config cfg;
	struct s3_client *c;
	struct logger log;
	char err[512];
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	assert_non_null(f);
	f->log = (struct logger){.level = LOG_INFO, .out = stderr, .name = "test_store"};
	int r = store_config_load(NULL, &f->cfg, f->err, sizeof(f->err));
	if (r)
		fail_msg("store_config_load: %s", f->err);
	struct s3_opts o = {.log = &f->log};
	r = s3_client_new(&f->cfg, &o, &f->c, f->err, sizeof(f->err));
	if (r)
		fail_msg("s3_client_new: %s", f->err);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	s3_client_free(f->c);
	store_config_wipe(&f->cfg);
	free(f);
	return 0;
}

#define OK(call)                                                                                   \
	do {                                                                                       \
		int r_ = (call);                                                                   \
		if (r_)                                                                            \
			fail_msg("%s: %d %s", #call, r_, f->err);                                  \
	} while (0)

/* Deterministic bytes: a data error shows up as a mismatch, not as a lucky equal. */
static void fill(uint8_t *p, size_t n, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 1;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		p[i] = (uint8_t)x;
	}
}

static int memfd_with(const uint8_t *data, size_t n)
{
	int fd = memfd_create("store-test", MFD_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, data, n), (ssize_t)n);
	return fd;
}

static void test_put_get_head_delete(void **state)
{
	struct fixture *f = *state;
	uint8_t data[5000], back[6000];
	fill(data, sizeof(data), 1);
	OK(s3_put(f->c, "obj/a", data, sizeof(data), 0, f->err, sizeof(f->err)));
	size_t got = 0;
	OK(s3_get(f->c, "obj/a", 0, 0, back, sizeof(back), &got, f->err, sizeof(f->err)));
	assert_int_equal(got, sizeof(data));
	assert_memory_equal(back, data, sizeof(data));
	/* a range, then one that runs past the end (answered up to the end) */
	OK(s3_get(f->c, "obj/a", 100, 50, back, sizeof(back), &got, f->err, sizeof(f->err)));
	assert_int_equal(got, 50);
	assert_memory_equal(back, data + 100, 50);
	OK(s3_get(f->c, "obj/a", 4990, 100, back, sizeof(back), &got, f->err, sizeof(f->err)));
	assert_int_equal(got, 10);
	assert_memory_equal(back, data + 4990, 10);
	/* the cap: a reply larger than the caller's buffer is refused */
	assert_int_equal(s3_get(f->c, "obj/a", 0, 0, back, 100, &got, f->err, sizeof(f->err)),
			 -EFBIG);
	assert_null(strchr(f->err, '\n'));
	struct s3_object_info info;
	OK(s3_head(f->c, "obj/a", &info, f->err, sizeof(f->err)));
	assert_int_equal(info.size, sizeof(data));
	assert_true(info.etag[0] == '"');
	/* GET into an fd at an offset */
	int fd = memfd_create("get", MFD_CLOEXEC);
	uint64_t g64 = 0;
	OK(s3_get_fd(f->c, "obj/a", 1000, 2000, fd, 7, 2000, &g64, f->err, sizeof(f->err)));
	assert_int_equal(g64, 2000);
	assert_int_equal(pread(fd, back, 2000, 7), 2000);
	assert_memory_equal(back, data + 1000, 2000);
	close(fd);
	/* PUT from an fd range (streamed: UNSIGNED-PAYLOAD over TLS) */
	fd = memfd_with(data, sizeof(data));
	OK(s3_put_fd(f->c, "obj/b", fd, 10, 3000, 0, f->err, sizeof(f->err)));
	close(fd);
	OK(s3_get(f->c, "obj/b", 0, 0, back, sizeof(back), &got, f->err, sizeof(f->err)));
	assert_int_equal(got, 3000);
	assert_memory_equal(back, data + 10, 3000);
	/* a key that needs encoding */
	OK(s3_put(f->c, "obj/sp ace+plus%&=?", "x", 1, 0, f->err, sizeof(f->err)));
	OK(s3_get(f->c, "obj/sp ace+plus%&=?", 0, 0, back, sizeof(back), &got, f->err,
		  sizeof(f->err)));
	assert_int_equal(got, 1);
	/* an empty object */
	OK(s3_put(f->c, "obj/empty", "", 0, 0, f->err, sizeof(f->err)));
	OK(s3_head(f->c, "obj/empty", &info, f->err, sizeof(f->err)));
	assert_int_equal(info.size, 0);
	OK(s3_delete(f->c, "obj/a", f->err, sizeof(f->err)));
	assert_int_equal(s3_head(f->c, "obj/a", &info, f->err, sizeof(f->err)), -ENOENT);
	assert_int_equal(
	    s3_get(f->c, "obj/a", 0, 0, back, sizeof(back), &got, f->err, sizeof(f->err)), -ENOENT);
	assert_non_null(strstr(f->err, "NoSuchKey"));
	OK(s3_delete(f->c, "obj/a", f->err, sizeof(f->err))); /* missing: still fine */
	OK(s3_delete(f->c, "obj/b", f->err, sizeof(f->err)));
	OK(s3_delete(f->c, "obj/sp ace+plus%&=?", f->err, sizeof(f->err)));
	OK(s3_delete(f->c, "obj/empty", f->err, sizeof(f->err)));
}

static void test_list_continuation(void **state)
{
	struct fixture *f = *state;
	char key[64];
	for (int i = 0; i < 7; i++) {
		snprintf(key, sizeof(key), "list/k%02d", i);
		OK(s3_put(f->c, key, key, strlen(key), 0, f->err, sizeof(f->err)));
	}
	OK(s3_put(f->c, "listother/x", "x", 1, 0, f->err, sizeof(f->err)));
	char token[S3_KEY_MAX + 1] = "";
	int seen = 0, pages = 0;
	for (;;) {
		struct s3_list_page p;
		OK(s3_list(f->c, "list/", token, 3, &p, f->err, sizeof(f->err)));
		pages++;
		assert_true(p.n <= 3);
		for (size_t i = 0; i < p.n; i++) {
			snprintf(key, sizeof(key), "list/k%02d", seen);
			assert_string_equal(p.entries[i].key, key);
			assert_int_equal(p.entries[i].size, strlen(key));
			seen++;
		}
		bool more = p.truncated;
		snprintf(token, sizeof(token), "%s", p.next_token);
		s3_list_page_free(&p);
		if (!more)
			break;
	}
	assert_int_equal(seen, 7);
	assert_int_equal(pages, 3);
	for (int i = 0; i < 7; i++) {
		snprintf(key, sizeof(key), "list/k%02d", i);
		OK(s3_delete(f->c, key, f->err, sizeof(f->err)));
	}
	OK(s3_delete(f->c, "listother/x", f->err, sizeof(f->err)));
}

static void test_conditional_create(void **state)
{
	struct fixture *f = *state;
	OK(s3_delete(f->c, "cond/k", f->err, sizeof(f->err)));
	OK(s3_put(f->c, "cond/k", "one", 3, S3_IF_NONE_MATCH, f->err, sizeof(f->err)));
	assert_int_equal(s3_put(f->c, "cond/k", "two", 3, S3_IF_NONE_MATCH, f->err, sizeof(f->err)),
			 -EEXIST);
	assert_non_null(strstr(f->err, "412"));
	char back[8];
	size_t got;
	OK(s3_get(f->c, "cond/k", 0, 0, back, sizeof(back), &got, f->err, sizeof(f->err)));
	assert_int_equal(got, 3);
	assert_memory_equal(back, "one", 3);
	OK(s3_delete(f->c, "cond/k", f->err, sizeof(f->err)));
}

static void test_probe(void **state)
{
	struct fixture *f = *state;
	OK(store_probe(f->c, f->err, sizeof(f->err)));
	struct s3_list_page p;
	OK(s3_list(f->c, "probe/", NULL, 10, &p, f->err, sizeof(f->err)));
	assert_int_equal(p.n, 0); /* the probe key was deleted */
	s3_list_page_free(&p);
}

static size_t no_uploads_left(struct fixture *f, const char *prefix)
{
	struct s3_upload_entry *u;
	size_t n;
	OK(s3_list_uploads(f->c, prefix, 100, &u, &n, f->err, sizeof(f->err)));
	for (size_t i = 0; i < n; i++)
		fprintf(stderr, "left over: %s %s\n", u[i].key, u[i].upload_id);
	free(u);
	return n;
}

/* 24 MiB in 5 MiB parts, 4 in flight; a ranged GET across a part boundary. */
static void upload_and_check(struct fixture *f, struct s3_client *c, const char *key, uint32_t seed,
			     const struct s3_upload_hooks *hooks)
{
	size_t n = 24 * MIB;
	uint8_t *data = malloc(n), *back = malloc(n);
	assert_non_null(data);
	assert_non_null(back);
	fill(data, n, seed);
	int fd = memfd_with(data, n);
	double t0 = now_s();
	OK(s3_upload_fd(c, key, fd, 0, n, hooks, f->err, sizeof(f->err)));
	fprintf(stderr, "multipart: %zu MiB in %.2f s\n", n / MIB, now_s() - t0);
	close(fd);
	struct s3_object_info info;
	OK(s3_head(c, key, &info, f->err, sizeof(f->err)));
	assert_int_equal(info.size, n);
	size_t got;
	uint64_t b = 5 * MIB;
	OK(s3_get(c, key, b - 1000, 3000, back, n, &got, f->err, sizeof(f->err)));
	assert_int_equal(got, 3000);
	assert_memory_equal(back, data + b - 1000, 3000);
	OK(s3_get(c, key, 0, 0, back, n, &got, f->err, sizeof(f->err)));
	assert_int_equal(got, n);
	assert_true(memcmp(back, data, n) == 0);
	free(data);
	free(back);
}

static struct s3_client *mpu_client(struct fixture *f, int attempts)
{
	struct s3_opts o = {.log = &f->log,
			    .part_size = 5 * MIB,
			    .parallel = 4,
			    .max_attempts = attempts,
			    .base_delay_ms = 200,
			    .max_delay_ms = 3000,
			    .connect_timeout_ms = 3000,
			    .stall_timeout_s = 10};
	struct s3_client *c;
	OK(s3_client_new(&f->cfg, &o, &c, f->err, sizeof(f->err)));
	return c;
}

static void test_multipart(void **state)
{
	struct fixture *f = *state;
	struct s3_client *c = mpu_client(f, 6);
	upload_and_check(f, c, "mpu/big", 7, NULL);
	assert_int_equal(no_uploads_left(f, "mpu/"), 0);
	/* create then abort: nothing left */
	char id[S3_UPLOAD_ID_MAX + 1];
	OK(s3_mpu_create(c, "mpu/aborted", id, sizeof(id), f->err, sizeof(f->err)));
	assert_int_equal(no_uploads_left(f, "mpu/"), 1);
	OK(s3_mpu_abort(c, "mpu/aborted", id, f->err, sizeof(f->err)));
	assert_int_equal(no_uploads_left(f, "mpu/"), 0);
	OK(s3_delete(c, "mpu/big", f->err, sizeof(f->err)));
	s3_client_free(c);
}

static void run_bounce(const char *down_s)
{
	const char *bounce = getenv("COVE_TEST_RGW_BOUNCE");
	assert_non_null(bounce);
	pid_t p = fork();
	assert_true(p >= 0);
	if (p == 0) {
		execl("/bin/sh", "sh", bounce, down_s, (char *)NULL);
		_exit(127);
	}
	int st;
	assert_int_equal(waitpid(p, &st, 0), p);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

struct bounce_state {
	int parts_done;
	int parts_done_at_kill;
	bool bounced;
};

static void count_part(void *arg, int part)
{
	struct bounce_state *b = arg;
	(void)part;
	b->parts_done++;
}

/* Halfway through the bytes, while parts are on the wire: radosgw dies, and stays down 1.5 s. */
static void bounce_halfway(void *arg, uint64_t total)
{
	struct bounce_state *b = arg;
	if (!b->bounced && total >= 12 * MIB) {
		b->bounced = true;
		b->parts_done_at_kill = b->parts_done;
		fprintf(stderr, "%llu bytes read, %d parts stored: killing radosgw (not the OSD)\n",
			(unsigned long long)total, b->parts_done);
		run_bounce("1.5");
	}
}

static void test_fault_rgw_killed_mid_upload(void **state)
{
	struct fixture *f = *state;
	struct s3_client *c = mpu_client(f, 12);
	struct bounce_state b = {0};
	struct s3_upload_hooks hooks = {
	    .part_done = count_part, .bytes_read = bounce_halfway, .arg = &b};
	upload_and_check(f, c, "fault/big", 11, &hooks);
	assert_true(b.bounced);
	assert_int_equal(b.parts_done, 5);
	assert_true(b.parts_done_at_kill < 5);
	uint64_t req, retries;
	s3_client_counts(c, &req, &retries);
	fprintf(stderr, "fault: %llu requests, %llu retries\n", (unsigned long long)req,
		(unsigned long long)retries);
	assert_true(retries >= 2); /* parts cut on the wire, and connections refused while down */
	assert_int_equal(no_uploads_left(f, ""), 0);
	OK(s3_delete(c, "fault/big", f->err, sizeof(f->err)));
	s3_client_free(c);
}

/* An upload that gives up (here: its file is shorter than the range it was asked to send, a
 * local error never retried) aborts its multipart upload: nothing is left in the store. */
static void test_upload_gives_up_and_aborts(void **state)
{
	struct fixture *f = *state;
	struct s3_client *c = mpu_client(f, 3);
	size_t n = 7 * MIB;
	uint8_t *data = malloc(n);
	assert_non_null(data);
	fill(data, n, 5);
	int fd = memfd_with(data, n);
	int r = s3_upload_fd(c, "giveup/k", fd, 0, 12 * MIB, NULL, f->err, sizeof(f->err));
	fprintf(stderr, "gave up: %s\n", f->err);
	assert_true(r < 0);
	assert_null(strchr(f->err, '\n'));
	assert_int_equal(no_uploads_left(f, "giveup/"), 0);
	struct s3_object_info info;
	assert_int_equal(s3_head(c, "giveup/k", &info, f->err, sizeof(f->err)), -ENOENT);
	close(fd);
	free(data);
	s3_client_free(c);
}

/* `cove store probe` (cove execs cove-store) on the same store.json: exit 0. */
static void test_cli_probe(void **state)
{
	(void)state;
	const char *cove = getenv("COVE_BIN");
	assert_non_null(cove);
	pid_t p = fork();
	assert_true(p >= 0);
	if (p == 0) {
		execl(cove, "cove", "store", "probe", (char *)NULL);
		_exit(127);
	}
	int st;
	assert_int_equal(waitpid(p, &st, 0), p);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

/* cove with args; its exit status (stdout to /dev/null). */
static int run_cove(const char *const *args)
{
	const char *cove = getenv("COVE_BIN");
	assert_non_null(cove);
	pid_t p = fork();
	assert_true(p >= 0);
	if (p == 0) {
		if (!freopen("/dev/null", "w", stdout))
			_exit(126);
		execv(cove, (char *const *)args);
		_exit(127);
	}
	int st;
	assert_int_equal(waitpid(p, &st, 0), p);
	assert_true(WIFEXITED(st));
	return WEXITSTATUS(st);
}

/* `cove store put FILE KEY`: a 20 MiB file (over the single-PUT limit: multipart) reads back
 * equal; keys under sandboxes/ and blobs/sha256/ are refused without a request. */
static void test_cli_put(void **state)
{
	struct fixture *f = *state;
	size_t n = 20 * MIB;
	uint8_t *data = malloc(n), *back = malloc(n);
	assert_non_null(data);
	assert_non_null(back);
	fill(data, n, 29);
	char path[] = "/tmp/cove-store-put.XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, data, n), (ssize_t)n);
	close(fd);
	const char *put[] = {"cove", "store", "put", path, "put/k", NULL};
	assert_int_equal(run_cove(put), 0);
	size_t got;
	OK(s3_get(f->c, "put/k", 0, 0, back, n, &got, f->err, sizeof(f->err)));
	assert_int_equal(got, n);
	assert_memory_equal(back, data, n);
	struct s3_object_info info;
	OK(s3_head(f->c, "put/k", &info, f->err, sizeof(f->err)));
	assert_non_null(strstr(info.etag, "-3")); /* 3 parts of 8 MiB: multipart */
	const char *fleet[] = {"cove", "store", "put", path, "sandboxes/x/gen/1.json", NULL};
	assert_int_equal(run_cove(fleet), 1);
	const char *blob[] = {"cove", "store", "put", path, "blobs/sha256/00", NULL};
	assert_int_equal(run_cove(blob), 1);
	assert_int_equal(s3_head(f->c, "blobs/sha256/00", &info, f->err, sizeof(f->err)), -ENOENT);
	OK(s3_delete(f->c, "put/k", f->err, sizeof(f->err)));
	unlink(path);
	free(data);
	free(back);
}

static void test_tls_other_ca_refused(void **state)
{
	struct fixture *f = *state;
	const char *other = getenv("COVE_TEST_OTHER_CA");
	assert_non_null(other);
	struct store_config cfg = f->cfg;
	snprintf(cfg.ca_file, sizeof(cfg.ca_file), "%s", other);
	struct s3_client *c;
	OK(s3_client_new(&cfg, NULL, &c, f->err, sizeof(f->err)));
	struct s3_object_info info;
	assert_int_equal(s3_head(c, "whatever", &info, f->err, sizeof(f->err)), -EKEYREJECTED);
	fprintf(stderr, "wrong CA: %s\n", f->err);
	assert_non_null(strstr(f->err, "certificate"));
	assert_null(strchr(f->err, '\n'));
	uint64_t req, retries;
	s3_client_counts(c, &req, &retries);
	assert_int_equal(retries, 0); /* a certificate error is not retried */
	s3_client_free(c);
	store_config_wipe(&cfg);
}

/* insecure_http (said explicitly, for tests): a body streamed from an fd is hashed in a first
 * pass (no UNSIGNED-PAYLOAD without TLS) and radosgw checks that hash. */
static void test_insecure_http_fd_body(void **state)
{
	struct fixture *f = *state;
	const char *port = getenv("COVE_TEST_RGW_HTTP_PORT");
	assert_non_null(port);
	struct store_config cfg = f->cfg;
	snprintf(cfg.endpoint, sizeof(cfg.endpoint), "http://127.0.0.1:%s", port);
	cfg.insecure_http = true;
	struct s3_client *c;
	OK(s3_client_new(&cfg, NULL, &c, f->err, sizeof(f->err)));
	static uint8_t data[300000], back[300000];
	fill(data, sizeof(data), 3);
	int fd = memfd_with(data, sizeof(data));
	OK(s3_put_fd(c, "http/k", fd, 1000, 200000, 0, f->err, sizeof(f->err)));
	close(fd);
	size_t got;
	OK(s3_get(f->c, "http/k", 0, 0, back, sizeof(back), &got, f->err, sizeof(f->err)));
	assert_int_equal(got, 200000);
	assert_memory_equal(back, data + 1000, 200000);
	OK(s3_delete(c, "http/k", f->err, sizeof(f->err)));
	s3_client_free(c);
	store_config_wipe(&cfg);
}

static void test_virtual_hosted(void **state)
{
	struct fixture *f = *state;
	const char *port = getenv("COVE_TEST_RGW_PORT");
	assert_non_null(port);
	struct store_config cfg = f->cfg;
	snprintf(cfg.endpoint, sizeof(cfg.endpoint), "https://s3.test:%s", port);
	cfg.addressing = STORE_ADDR_VIRTUAL;
	char r1[128];
	snprintf(r1, sizeof(r1), "%s.s3.test:%s:127.0.0.1", cfg.bucket, port);
	const char *resolve[] = {r1, NULL};
	struct s3_opts o = {.resolve = resolve};
	struct s3_client *c;
	OK(s3_client_new(&cfg, &o, &c, f->err, sizeof(f->err)));
	OK(s3_put(c, "vhost/k", "virtual", 7, 0, f->err, sizeof(f->err)));
	char back[16];
	size_t got;
	/* read back through the path-style client: the same bucket */
	OK(s3_get(f->c, "vhost/k", 0, 0, back, sizeof(back), &got, f->err, sizeof(f->err)));
	assert_int_equal(got, 7);
	assert_memory_equal(back, "virtual", 7);
	struct s3_list_page p;
	OK(s3_list(c, "vhost/", NULL, 10, &p, f->err, sizeof(f->err)));
	assert_int_equal(p.n, 1);
	assert_string_equal(p.entries[0].key, "vhost/k");
	s3_list_page_free(&p);
	OK(s3_delete(c, "vhost/k", f->err, sizeof(f->err)));
	s3_client_free(c);
	store_config_wipe(&cfg);
}

int main(void)
{
	const char *start = getenv("COVE_TEST_RGW_START_S");
	fprintf(stderr, "store suite: radosgw started in %s s\n", start ? start : "?");
	curl_global_init(CURL_GLOBAL_DEFAULT);
	xmlInitParser();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_put_get_head_delete, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_list_continuation, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_conditional_create, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_probe, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_cli_probe, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_cli_put, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_tls_other_ca_refused, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_insecure_http_fd_body, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_virtual_hosted, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_multipart, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_upload_gives_up_and_aborts, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_fault_rgw_killed_mid_upload, setup, teardown),
	};
	int r = cmocka_run_group_tests(tests, NULL, NULL);
	xmlCleanupParser();
	curl_global_cleanup();
	return r;
}
