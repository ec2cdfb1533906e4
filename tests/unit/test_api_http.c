/* Unit tests for sandbox/api_http: the control API's HTTP server over a real Unix socket. */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>

#include <jansson.h>

#include "api_fake.h"
#include "vmm/evloop.h"

/* ---- HTTP over a real Unix socket ---- */

struct http_fixture {
	char dir[64];
	char path[96];
	struct evloop loop;
	struct api_server *srv;
	struct fake_vm vm;
	pthread_t thread;
	atomic_bool stop;
};

static void *loop_thread(void *arg)
{
	struct http_fixture *fx = arg;

	while (!atomic_load(&fx->stop)) {
		if (evloop_run_once(&fx->loop, 50) < 0)
			break;
	}
	return NULL;
}

static int http_setup(void **state)
{
	struct http_fixture *fx = calloc(1, sizeof(*fx));

	if (!fx)
		return -1;
	strcpy(fx->dir, "/tmp/cove-api-XXXXXX");
	if (!mkdtemp(fx->dir))
		goto err;
	snprintf(fx->path, sizeof(fx->path), "%s/api.sock", fx->dir);
	fx->vm = fake_running();
	if (evloop_init(&fx->loop) < 0)
		goto err_dir;
	struct api_backend be = fake_backend(&fx->vm);
	if (api_server_start(&fx->srv, fx->path, &be, &fx->loop) < 0)
		goto err_loop;
	if (pthread_create(&fx->thread, NULL, loop_thread, fx) != 0)
		goto err_srv;
	*state = fx;
	return 0;

err_srv:
	api_server_stop(fx->srv);
err_loop:
	evloop_destroy(&fx->loop);
err_dir:
	rmdir(fx->dir);
err:
	free(fx);
	return -1;
}

static int http_teardown(void **state)
{
	struct http_fixture *fx = *state;

	atomic_store(&fx->stop, true);
	pthread_join(fx->thread, NULL);
	api_server_stop(fx->srv);
	evloop_destroy(&fx->loop);
	/* Stopping removes the socket, so the directory is empty again. */
	int r = rmdir(fx->dir);
	free(fx);
	return r;
}

static int client_connect(const char *path)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	struct timeval tv = {.tv_sec = 5};
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	strcpy(addr.sun_path, path);
	assert_int_equal(connect(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
	/* A hung server fails the test instead of hanging it. */
	assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
	assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)), 0);
	return fd;
}

/* Sends what it can; the server may legitimately hang up mid-upload. */
static void client_send(int fd, const void *data, size_t len)
{
	const char *p = data;

	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
		if (n <= 0)
			return;
		p += n;
		len -= (size_t)n;
	}
}

/*
 * Reads one response: headers, then Content-Length bytes of body.  Returns
 * the status (0 if the server closed without answering); *body gets the
 * parsed JSON body or NULL.
 */
static int client_read_response(int fd, json_t **body, char *head, size_t head_len)
{
	char buf[8192];
	size_t len = 0;
	char *end = NULL;

	*body = NULL;
	while (!end) {
		if (len == sizeof(buf) - 1)
			fail_msg("response headers too long");
		ssize_t n = recv(fd, buf + len, 1, 0);
		/* A Unix socket closed with our bytes unread reports a reset, not EOF. */
		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return 0;
		if (n < 0)
			fail_msg("recv: %s", strerror(errno));
		len += (size_t)n;
		buf[len] = '\0';
		end = strstr(buf, "\r\n\r\n");
	}
	if (head) {
		size_t n = len < head_len - 1 ? len : head_len - 1;
		memcpy(head, buf, n);
		head[n] = '\0';
	}

	int status = 0;
	assert_int_equal(sscanf(buf, "HTTP/1.1 %d", &status), 1);
	size_t clen = 0;
	const char *cl = strcasestr(buf, "\r\nContent-Length:");
	if (cl)
		clen = strtoul(cl + 17, NULL, 10);
	assert_true(clen < sizeof(buf));
	size_t got = 0;
	while (got < clen) {
		ssize_t n = recv(fd, buf + got, clen - got, 0);
		if (n <= 0)
			fail_msg("short body: %zu of %zu", got, clen);
		got += (size_t)n;
	}
	if (clen && strstr(head ? head : "", "application/json")) {
		json_error_t err;
		*body = json_loadb(buf, clen, 0, &err);
		assert_non_null(*body);
	}
	return status;
}

static int client_roundtrip(const char *path, const char *req, size_t len, json_t **body)
{
	char head[4096];
	int fd = client_connect(path);

	client_send(fd, req, len);
	int status = client_read_response(fd, body, head, sizeof(head));
	close(fd);
	return status;
}

static void expect_get_vm_ok(struct http_fixture *fx)
{
	static const char req[] = "GET /vm HTTP/1.1\r\nHost: x\r\n\r\n";
	json_t *j;

	assert_int_equal(client_roundtrip(fx->path, req, sizeof(req) - 1, &j), 200);
	assert_non_null(j);
	assert_string_equal(json_string_value(json_object_get(j, "state")), "Running");
	assert_int_equal(json_integer_value(json_object_get(j, "vcpus")), 2);
	json_decref(j);
}

static void test_http_get_vm(void **state)
{
	struct http_fixture *fx = *state;
	static const char req[] = "GET /vm HTTP/1.1\r\nHost: x\r\n\r\n";
	char head[4096];
	json_t *j;

	int fd = client_connect(fx->path);
	client_send(fd, req, sizeof(req) - 1);
	assert_int_equal(client_read_response(fd, &j, head, sizeof(head)), 200);
	assert_true(strncmp(head, "HTTP/1.1 200", 12) == 0);
	assert_non_null(strcasestr(head, "Content-Type: application/json"));
	assert_string_equal(json_string_value(json_object_get(j, "state")), "Running");
	json_decref(j);

	/* Keep-alive: a second request on the same connection. */
	client_send(fd, req, sizeof(req) - 1);
	assert_int_equal(client_read_response(fd, &j, NULL, 0), 200);
	json_decref(j);
	close(fd);
}

static void test_http_garbage(void **state)
{
	struct http_fixture *fx = *state;
	static const char junk[] = "\x01\x02 nonsense\r\n\r\n";
	char head[4096];
	json_t *j;

	int fd = client_connect(fx->path);
	client_send(fd, junk, sizeof(junk) - 1);
	int status = client_read_response(fd, &j, head, sizeof(head));
	json_decref(j);
	if (status != 0 && (status < 400 || status > 499))
		fail_msg("garbage got status %d", status);
	close(fd);

	expect_get_vm_ok(fx);
}

/* Formats a request with a correct Content-Length; returns its length. */
static size_t http_req(char *buf, size_t len, const char *method, const char *path,
		       const char *body)
{
	int n = snprintf(buf, len,
			 "%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
			 "Content-Length: %zu\r\n\r\n%s",
			 method, path, strlen(body), body);
	assert_true(n > 0 && (size_t)n < len);
	return (size_t)n;
}

static void test_http_patch_and_put(void **state)
{
	struct http_fixture *fx = *state;
	char req[512];
	size_t n;
	json_t *j;

	n = http_req(req, sizeof(req), "PATCH", "/vm", "{\"state\":\"Paused\"}");
	assert_int_equal(client_roundtrip(fx->path, req, n, &j), 204);
	assert_null(j);
	assert_int_equal(fx->vm.pauses, 1);

	n = http_req(req, sizeof(req), "PUT", "/actions", "{\"action_type\":\"SendCtrlAltDel\"}");
	assert_int_equal(client_roundtrip(fx->path, req, n, &j), 204);
	assert_int_equal(fx->vm.cads, 1);

	n = http_req(req, sizeof(req), "PATCH", "/vm", "{\"sta");
	assert_int_equal(client_roundtrip(fx->path, req, n, &j), 400);
	assert_non_null(json_object_get(j, "fault_message"));
	json_decref(j);

	n = http_req(req, sizeof(req), "DELETE", "/vm?x=1", "");
	assert_int_equal(client_roundtrip(fx->path, req, n, &j), 405);
	json_decref(j);
}

static void test_http_oversized(void **state)
{
	struct http_fixture *fx = *state;
	size_t body_len = 100 * 1024;
	char head[256];
	json_t *j;

	int n = snprintf(head, sizeof(head),
			 "PATCH /vm HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n", body_len);
	char *req = malloc((size_t)n + body_len);
	assert_non_null(req);
	memcpy(req, head, (size_t)n);
	memset(req + n, ' ', body_len);
	assert_int_equal(client_roundtrip(fx->path, req, (size_t)n + body_len, &j), 413);
	assert_non_null(json_object_get(j, "fault_message"));
	json_decref(j);
	free(req);

	expect_get_vm_ok(fx);
}

/* Without Content-Length the limit can only bite mid-upload. */
static void test_http_oversized_chunked(void **state)
{
	struct http_fixture *fx = *state;
	static const char head[] =
	    "PATCH /vm HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
	char chunk_head[32];
	size_t chunk = 4096;
	char *data = malloc(chunk);
	json_t *j;

	assert_non_null(data);
	memset(data, ' ', chunk);
	int fd = client_connect(fx->path);
	client_send(fd, head, sizeof(head) - 1);
	int hl = snprintf(chunk_head, sizeof(chunk_head), "%zx\r\n", chunk);
	for (int i = 0; i < 8; i++) {
		client_send(fd, chunk_head, (size_t)hl);
		client_send(fd, data, chunk);
		client_send(fd, "\r\n", 2);
	}
	client_send(fd, "0\r\n\r\n", 5);
	assert_int_equal(client_read_response(fd, &j, NULL, 0), 413);
	json_decref(j);
	close(fd);
	free(data);

	expect_get_vm_ok(fx);
}

/* A client streaming an endless chunked body is cut off rather than read forever. */
static void test_http_endless_chunked(void **state)
{
	struct http_fixture *fx = *state;
	static const char head[] =
	    "PUT /actions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
	size_t chunk = 64 * 1024;
	char *data = malloc(chunk + 16);
	json_t *j;

	assert_non_null(data);
	int hl = snprintf(data, 16, "%zx\r\n", chunk);
	memset(data + hl, ' ', chunk);
	int fd = client_connect(fx->path);
	client_send(fd, head, sizeof(head) - 1);
	for (int i = 0; i < 64; i++) {
		client_send(fd, data, (size_t)hl + chunk);
		client_send(fd, "\r\n", 2);
	}
	assert_int_equal(client_read_response(fd, &j, NULL, 0), 0);
	close(fd);
	free(data);
	assert_int_equal(fx->vm.cads, 0);

	expect_get_vm_ok(fx);
}

static void test_http_long_url(void **state)
{
	struct http_fixture *fx = *state;
	char req[512];
	json_t *j;

	int n = snprintf(req, sizeof(req), "GET /%0300d HTTP/1.1\r\nHost: x\r\n\r\n", 0);
	assert_int_equal(client_roundtrip(fx->path, req, (size_t)n, &j), 414);
	json_decref(j);
}

static void test_http_socket_mode(void **state)
{
	struct http_fixture *fx = *state;
	struct stat st;

	assert_int_equal(lstat(fx->path, &st), 0);
	assert_true(S_ISSOCK(st.st_mode));
	assert_int_equal(st.st_mode & 0777, 0600);
}

static void test_http_refuses_non_socket(void **state)
{
	char dir[] = "/tmp/cove-api-XXXXXX";
	char path[64];
	struct evloop loop;
	struct api_server *srv;
	struct fake_vm vm = fake_running();
	struct api_backend be = fake_backend(&vm);

	(void)state;
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/api.sock", dir);
	assert_int_equal(evloop_init(&loop), 0);

	int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(api_server_start(&srv, path, &be, &loop), -EEXIST);
	assert_int_equal(unlink(path), 0);

	/* A stale socket left by a previous run is replaced. */
	int s = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	strcpy(addr.sun_path, path);
	assert_int_equal(bind(s, (struct sockaddr *)&addr, sizeof(addr)), 0);
	close(s);
	assert_int_equal(api_server_start(&srv, path, &be, &loop), 0);
	api_server_stop(srv);
	assert_int_equal(access(path, F_OK), -1);

	evloop_destroy(&loop);
	assert_int_equal(rmdir(dir), 0);
}

/* A raw exchange: sends, half-closes, reads until EOF or timeout; returns the bytes read. */
static size_t client_raw(const char *path, const char *req, size_t len, char *out, size_t cap)
{
	int fd = client_connect(path);
	size_t got = 0;

	client_send(fd, req, len);
	shutdown(fd, SHUT_WR);
	while (got < cap - 1) {
		ssize_t n = recv(fd, out + got, cap - 1 - got, 0);
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	out[got] = '\0';
	close(fd);
	return got;
}

static void test_http_version(void **state)
{
	struct http_fixture *fx = *state;
	static const char req[] = "GET /vm HTTP/9.9\r\nHost: x\r\n\r\n";
	char out[4096];

	client_raw(fx->path, req, sizeof(req) - 1, out, sizeof(out));
	assert_true(strncmp(out, "HTTP/1.1 505", 12) == 0);
	assert_non_null(strstr(out, "fault_message"));
	expect_get_vm_ok(fx);
}

/* Too many header lines, or too many header bytes: 431 with a fault body, then closed. */
static void test_http_header_limits(void **state)
{
	struct http_fixture *fx = *state;
	size_t cap = 64 * 1024;
	char *req = malloc(cap), out[4096];
	size_t n = 0;

	assert_non_null(req);
	n += (size_t)snprintf(req, cap, "GET /vm HTTP/1.1\r\n");
	for (int i = 0; i < 100; i++)
		n += (size_t)snprintf(req + n, cap - n, "X-H%d: v\r\n", i);
	n += (size_t)snprintf(req + n, cap - n, "\r\n");
	client_raw(fx->path, req, n, out, sizeof(out));
	assert_true(strncmp(out, "HTTP/1.1 431", 12) == 0);
	assert_non_null(strstr(out, "fault_message"));

	n = (size_t)snprintf(req, cap, "GET /vm HTTP/1.1\r\nX-Big: ");
	memset(req + n, 'a', 40 * 1024);
	n += 40 * 1024;
	n += (size_t)snprintf(req + n, cap - n, "\r\n\r\n");
	client_raw(fx->path, req, n, out, sizeof(out));
	assert_true(strncmp(out, "HTTP/1.1 431", 12) == 0);
	free(req);
	expect_get_vm_ok(fx);
}

/* Two requests in one write get two answers, in order, on the same connection. */
static void test_http_pipelined(void **state)
{
	struct http_fixture *fx = *state;
	char req[512];
	json_t *j;
	int n = snprintf(req, sizeof(req),
			 "PATCH /vm HTTP/1.1\r\nHost: x\r\nContent-Length: 18\r\n\r\n"
			 "{\"state\":\"Paused\"}GET /vm HTTP/1.1\r\nHost: x\r\n\r\n");
	int fd = client_connect(fx->path);

	client_send(fd, req, (size_t)n);
	assert_int_equal(client_read_response(fd, &j, NULL, 0), 204);
	assert_int_equal(client_read_response(fd, &j, NULL, 0), 200);
	close(fd);
	assert_int_equal(fx->vm.pauses, 1);
}

/* "Expect: 100-continue" is invited to send its body; an oversized one is refused instead. */
static void test_http_expect_continue(void **state)
{
	struct http_fixture *fx = *state;
	static const char head[] = "PATCH /vm HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
				   "Content-Length: 18\r\n\r\n";
	char buf[64] = {0};
	json_t *j;
	int fd = client_connect(fx->path);

	client_send(fd, head, sizeof(head) - 1);
	assert_int_equal(recv(fd, buf, 25, MSG_WAITALL), 25);
	assert_string_equal(buf, "HTTP/1.1 100 Continue\r\n\r\n");
	client_send(fd, "{\"state\":\"Paused\"}", 18);
	assert_int_equal(client_read_response(fd, &j, NULL, 0), 204);
	close(fd);
	assert_int_equal(fx->vm.pauses, 1);

	static const char big[] = "PATCH /vm HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
				  "Content-Length: 1000000\r\n\r\n";
	fd = client_connect(fx->path);
	client_send(fd, big, sizeof(big) - 1);
	assert_int_equal(client_read_response(fd, &j, NULL, 0), 413);
	json_decref(j);
	close(fd);
}

/* The path is percent-decoded as before; HEAD gets the head only; HTTP/1.0 is closed after. */
static void test_http_path_head_http10(void **state)
{
	struct http_fixture *fx = *state;
	static const char enc[] = "GET /v%6d HTTP/1.0\r\n\r\n";
	static const char head[] = "HEAD /vm HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
	char out[4096];

	client_raw(fx->path, enc, sizeof(enc) - 1, out, sizeof(out));
	assert_true(strncmp(out, "HTTP/1.1 200", 12) == 0);
	assert_non_null(strstr(out, "Connection: close"));
	assert_non_null(strstr(out, "\"Running\""));
	client_raw(fx->path, head, sizeof(head) - 1, out, sizeof(out));
	assert_true(strncmp(out, "HTTP/1.1 405", 12) == 0);
	assert_non_null(strstr(out, "\r\n\r\n"));
	assert_string_equal(strstr(out, "\r\n\r\n"), "\r\n\r\n"); /* no body */
}

/* 16 connections at most: the 17th is closed unanswered; freeing one lets the next in. */
static void test_http_connection_limit(void **state)
{
	struct http_fixture *fx = *state;
	static const char req[] = "GET /vm HTTP/1.1\r\nHost: x\r\n\r\n";
	int fds[16];
	json_t *j;

	for (int i = 0; i < 16; i++) {
		fds[i] = client_connect(fx->path);
		/* Each is served, so each is surely accepted before the next connects. */
		client_send(fds[i], req, sizeof(req) - 1);
		assert_int_equal(client_read_response(fds[i], &j, NULL, 0), 200);
		json_decref(j);
	}
	int extra = client_connect(fx->path);
	client_send(extra, req, sizeof(req) - 1);
	assert_int_equal(client_read_response(extra, &j, NULL, 0), 0);
	close(extra);
	close(fds[0]);
	usleep(200 * 1000);
	expect_get_vm_ok(fx);
	for (int i = 1; i < 16; i++)
		close(fds[i]);
}

struct flooder {
	const char *path;
	atomic_bool stop;
	int fd;
};

/* Pipelines GETs and never reads an answer. */
static void *flood_thread(void *arg)
{
	struct flooder *f = arg;
	static const char req[] = "GET /vm HTTP/1.1\r\nHost: x\r\n\r\n";

	while (!atomic_load(&f->stop)) {
		if (send(f->fd, req, sizeof(req) - 1, MSG_NOSIGNAL) <= 0 && errno != EAGAIN)
			break;
	}
	return NULL;
}

/* A client that floods requests and reads nothing does not starve another client. */
static void test_http_flood_fair(void **state)
{
	struct http_fixture *fx = *state;
	struct flooder f = {.path = fx->path};
	struct timeval tv = {.tv_usec = 100 * 1000};
	pthread_t th;

	f.fd = client_connect(fx->path);
	assert_int_equal(setsockopt(f.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)), 0);
	assert_int_equal(pthread_create(&th, NULL, flood_thread, &f), 0);
	usleep(300 * 1000);
	for (int i = 0; i < 5; i++) {
		struct timespec t0, t1;

		clock_gettime(CLOCK_MONOTONIC, &t0);
		expect_get_vm_ok(fx);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
		if (ms > 1000)
			fail_msg("GET /vm took %.0f ms beside a flooding client", ms);
	}
	atomic_store(&f.stop, true);
	pthread_join(th, NULL);
	close(f.fd);
}

/*
 * Junk longer than one read gets its 400 and then a clean EOF: the server drains what it did
 * not parse instead of closing on it, which would reset the connection under the client.
 */
static void test_http_junk_clean_close(void **state)
{
	struct http_fixture *fx = *state;
	char junk[10240], out[4096];
	size_t got = 0;
	ssize_t n;
	int fd = client_connect(fx->path);

	for (size_t i = 0; i < sizeof(junk); i++)
		junk[i] = (char)(i & 255);
	client_send(fd, junk, sizeof(junk));
	shutdown(fd, SHUT_WR);
	while ((n = recv(fd, out + got, sizeof(out) - 1 - got, 0)) > 0)
		got += (size_t)n;
	out[got] = '\0';
	if (n < 0)
		fail_msg("recv after the answer: %s", strerror(errno));
	assert_true(strncmp(out, "HTTP/1.1 400", 12) == 0);
	assert_non_null(strstr(out, "fault_message"));
	close(fd);
	expect_get_vm_ok(fx);
}

/* A connection that says nothing for 10 s is closed (a slow client cannot hold a slot). */
static void test_http_idle_timeout(void **state)
{
	struct http_fixture *fx = *state;
	struct timeval tv = {.tv_sec = 15};
	char b;
	struct timespec t0, t1;
	int fd = client_connect(fx->path);

	assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
	client_send(fd, "GET /vm HTTP/1.1\r\n", 18);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	ssize_t n = recv(fd, &b, 1, 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	assert_true(n == 0 || (n < 0 && errno == ECONNRESET));
	long s = (long)(t1.tv_sec - t0.tv_sec);
	assert_true(s >= 9 && s <= 12);
	close(fd);
	expect_get_vm_ok(fx);
}

int main(void)
{
	const struct CMUnitTest plain[] = {
	    cmocka_unit_test(test_http_refuses_non_socket),
	};
	/* Each HTTP test gets a fresh server so fake VM counters start at zero. */
	const struct CMUnitTest http[] = {
	    cmocka_unit_test_setup_teardown(test_http_get_vm, http_setup, http_teardown),
	    cmocka_unit_test_setup_teardown(test_http_garbage, http_setup, http_teardown),
	    cmocka_unit_test_setup_teardown(test_http_patch_and_put, http_setup, http_teardown),
	    cmocka_unit_test_setup_teardown(test_http_oversized, http_setup, http_teardown),
	    cmocka_unit_test_setup_teardown(test_http_oversized_chunked, http_setup, http_teardown),
	    cmocka_unit_test_setup_teardown(test_http_endless_chunked, http_setup, http_teardown),
	    cmocka_unit_test_setup_teardown(test_http_long_url, http_setup, http_teardown),
	    cmocka_unit_test_setup_teardown(test_http_socket_mode, http_setup, http_teardown),
	    cmocka_unit_test_setup_teardown(test_http_version, http_setup, http_teardown),
	    cmocka_unit_test_setup_teardown(test_http_header_limits, http_setup, http_teardown),
	    cmocka_unit_test_setup_teardown(test_http_pipelined, http_setup, http_teardown),
	    cmocka_unit_test_setup_teardown(test_http_expect_continue, http_setup, http_teardown),
	    cmocka_unit_test_setup_teardown(test_http_path_head_http10, http_setup, http_teardown),
	    cmocka_unit_test_setup_teardown(test_http_connection_limit, http_setup, http_teardown),
	    cmocka_unit_test_setup_teardown(test_http_flood_fair, http_setup, http_teardown),
	    cmocka_unit_test_setup_teardown(test_http_idle_timeout, http_setup, http_teardown),
	    cmocka_unit_test_setup_teardown(test_http_junk_clean_close, http_setup, http_teardown),
	};
	int failed = cmocka_run_group_tests_name("api_http_plain", plain, NULL, NULL);

	failed += cmocka_run_group_tests_name("api_http", http, NULL, NULL);
	return failed ? 1 : 0;
}
