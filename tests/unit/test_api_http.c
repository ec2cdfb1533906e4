/* Unit tests for sandbox/api_http: the control API's HTTP server over a real Unix socket. */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>

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
	};
	int failed = cmocka_run_group_tests_name("api_http_plain", plain, NULL, NULL);

	failed += cmocka_run_group_tests_name("api_http", http, NULL, NULL);
	return failed ? 1 : 0;
}
