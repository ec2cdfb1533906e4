/* Unit tests for the control API handler against a fake VM, plus the HTTP server over a real Unix socket. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "sandbox/api.h"
#include "vmm/evloop.h"

struct fake_vm {
	const char *state;
	int vcpus;
	uint64_t mem_bytes;
	int info_ret, pause_ret, resume_ret, cad_ret, dirty_ret;
	int pauses, resumes, cads, dirty_calls;
	const struct api_dirty_range *ranges;
	size_t nr_ranges;
};

static int fake_get_info(void *opaque, struct api_vm_info *out)
{
	struct fake_vm *vm = opaque;

	if (vm->info_ret)
		return vm->info_ret;
	out->state = vm->state;
	out->vcpus = vm->vcpus;
	out->mem_bytes = vm->mem_bytes;
	out->version = "0.1.0";
	return 0;
}

static int fake_pause(void *opaque)
{
	struct fake_vm *vm = opaque;

	vm->pauses++;
	if (vm->pause_ret)
		return vm->pause_ret;
	vm->state = "Paused";
	return 0;
}

static int fake_resume(void *opaque)
{
	struct fake_vm *vm = opaque;

	vm->resumes++;
	if (vm->resume_ret)
		return vm->resume_ret;
	vm->state = "Running";
	return 0;
}

static int fake_ctrl_alt_del(void *opaque)
{
	struct fake_vm *vm = opaque;

	vm->cads++;
	return vm->cad_ret;
}

static int fake_dirty_pages(void *opaque, struct api_dirty_range *out, size_t max, size_t *nr)
{
	struct fake_vm *vm = opaque;
	size_t n = vm->nr_ranges < max ? vm->nr_ranges : max;

	vm->dirty_calls++;
	if (vm->dirty_ret && vm->dirty_ret != -E2BIG)
		return vm->dirty_ret;
	if (n)
		memcpy(out, vm->ranges, n * sizeof(*out));
	*nr = n;
	return vm->nr_ranges > max ? -E2BIG : vm->dirty_ret;
}

static struct fake_vm fake_running(void)
{
	return (struct fake_vm){ .state = "Running", .vcpus = 2, .mem_bytes = 256ull << 20 };
}

static struct api_backend fake_backend(struct fake_vm *vm)
{
	return (struct api_backend){
		.opaque = vm,
		.get_info = fake_get_info,
		.pause = fake_pause,
		.resume = fake_resume,
		.ctrl_alt_del = fake_ctrl_alt_del,
		.dirty_pages = fake_dirty_pages,
	};
}

/* Runs one request; returns the status and the parsed body (NULL when empty). */
static int request(struct fake_vm *vm, const char *method, const char *path, const char *body,
		   size_t len, json_t **out)
{
	struct api_backend be = fake_backend(vm);
	struct api_response resp;

	assert_int_equal(api_handle(&be, method, path, body, len, &resp), 0);
	*out = NULL;
	if (resp.body) {
		json_error_t err;
		*out = json_loads(resp.body, 0, &err);
		assert_non_null(*out);
	}
	free(resp.body);
	return resp.status;
}

static int request_str(struct fake_vm *vm, const char *method, const char *path, const char *body,
		       json_t **out)
{
	return request(vm, method, path, body, body ? strlen(body) : 0, out);
}

/* Asserts a fault reply and that its message mentions `needle` (if given). */
static void expect_fault(struct fake_vm *vm, const char *method, const char *path,
			 const char *body, size_t len, int status, const char *needle)
{
	json_t *j;

	assert_int_equal(request(vm, method, path, body, len, &j), status);
	assert_non_null(j);
	const char *msg = json_string_value(json_object_get(j, "fault_message"));
	assert_non_null(msg);
	assert_true(strlen(msg) > 0);
	if (needle && !strstr(msg, needle))
		fail_msg("fault '%s' does not mention '%s'", msg, needle);
	assert_int_equal(json_object_size(j), 1);
	json_decref(j);
}

static void expect_fault_str(struct fake_vm *vm, const char *method, const char *path,
			     const char *body, int status, const char *needle)
{
	expect_fault(vm, method, path, body, body ? strlen(body) : 0, status, needle);
}

static void test_get_vm(void **state)
{
	struct fake_vm vm = fake_running();
	json_t *j;

	(void)state;
	assert_int_equal(request_str(&vm, "GET", "/vm", NULL, &j), 200);
	assert_string_equal(json_string_value(json_object_get(j, "state")), "Running");
	assert_int_equal(json_integer_value(json_object_get(j, "vcpus")), 2);
	assert_int_equal(json_integer_value(json_object_get(j, "mem_bytes")), 256 << 20);
	assert_string_equal(json_string_value(json_object_get(j, "version")), "0.1.0");
	json_decref(j);
}

static void test_get_root(void **state)
{
	struct fake_vm vm = fake_running();
	json_t *j;

	(void)state;
	assert_int_equal(request_str(&vm, "GET", "/", NULL, &j), 200);
	assert_string_equal(json_string_value(json_object_get(j, "app_name")), "cove");
	assert_string_equal(json_string_value(json_object_get(j, "version")), "0.1.0");
	assert_string_equal(json_string_value(json_object_get(j, "state")), "Running");
	json_decref(j);
}

static void test_get_ignores_body_and_query(void **state)
{
	struct fake_vm vm = fake_running();
	json_t *j;

	(void)state;
	assert_int_equal(request_str(&vm, "GET", "/vm?verbose=1", "not json at all", &j), 200);
	assert_string_equal(json_string_value(json_object_get(j, "state")), "Running");
	json_decref(j);
}

static void test_pause_resume(void **state)
{
	struct fake_vm vm = fake_running();
	json_t *j;

	(void)state;
	assert_int_equal(request_str(&vm, "PATCH", "/vm", "{\"state\":\"Paused\"}", &j), 204);
	assert_null(j);
	assert_int_equal(vm.pauses, 1);
	assert_string_equal(vm.state, "Paused");

	assert_int_equal(request_str(&vm, "PATCH", "/vm", "{\"state\":\"Resumed\"}", &j), 204);
	assert_null(j);
	assert_int_equal(vm.resumes, 1);
	assert_string_equal(vm.state, "Running");
}

static void test_pause_idempotent(void **state)
{
	struct fake_vm vm = fake_running();
	json_t *j;

	(void)state;
	for (int i = 0; i < 3; i++) {
		assert_int_equal(request_str(&vm, "PATCH", "/vm", " {\"state\": \"Paused\"}\n", &j),
				 204);
		assert_null(j);
	}
	/* Already paused: the backend is not asked again. */
	assert_int_equal(vm.pauses, 1);

	/* Resuming a running VM is equally a no-op. */
	vm.state = "Running";
	assert_int_equal(request_str(&vm, "PATCH", "/vm", "{\"state\":\"Resumed\"}", &j), 204);
	assert_int_equal(vm.resumes, 0);
}

static void test_ctrl_alt_del(void **state)
{
	struct fake_vm vm = fake_running();
	json_t *j;

	(void)state;
	assert_int_equal(request_str(&vm, "PUT", "/actions", "{\"action_type\":\"SendCtrlAltDel\"}",
				     &j), 204);
	assert_null(j);
	assert_int_equal(vm.cads, 1);

	expect_fault_str(&vm, "PUT", "/actions", "{\"action_type\":\"FlushMetrics\"}", 400,
			 "SendCtrlAltDel");
	assert_int_equal(vm.cads, 1);
}

static void test_dirty_pages(void **state)
{
	static const struct api_dirty_range r[] = { { 0, 3 }, { 100, 1 }, { 1ull << 40, 16 } };
	struct fake_vm vm = fake_running();
	json_t *j;

	(void)state;
	vm.ranges = r;
	vm.nr_ranges = 3;
	assert_int_equal(request_str(&vm, "GET", "/debug/dirty_pages", NULL, &j), 200);
	assert_int_equal(vm.dirty_calls, 1);
	assert_int_equal(json_integer_value(json_object_get(j, "page_size")), 4096);
	assert_int_equal(json_integer_value(json_object_get(j, "total_pages")), 20);
	assert_true(json_is_false(json_object_get(j, "truncated")));
	json_t *ranges = json_object_get(j, "ranges");
	assert_int_equal(json_array_size(ranges), 3);
	for (size_t i = 0; i < 3; i++) {
		json_t *pair = json_array_get(ranges, i);
		assert_int_equal(json_array_size(pair), 2);
		assert_int_equal(json_integer_value(json_array_get(pair, 0)), r[i].first_pfn);
		assert_int_equal(json_integer_value(json_array_get(pair, 1)), r[i].nr_pages);
	}
	json_decref(j);
}

static void test_dirty_pages_empty(void **state)
{
	struct fake_vm vm = fake_running();
	json_t *j;

	(void)state;
	assert_int_equal(request_str(&vm, "GET", "/debug/dirty_pages", NULL, &j), 200);
	assert_int_equal(json_array_size(json_object_get(j, "ranges")), 0);
	assert_int_equal(json_integer_value(json_object_get(j, "total_pages")), 0);
	assert_true(json_is_false(json_object_get(j, "truncated")));
	json_decref(j);
}

static void test_dirty_pages_truncated(void **state)
{
	/* One more range than the handler's buffer holds. */
	size_t n = 65537;
	struct api_dirty_range *r = calloc(n, sizeof(*r));
	struct fake_vm vm = fake_running();
	json_t *j;

	(void)state;
	assert_non_null(r);
	for (size_t i = 0; i < n; i++)
		r[i] = (struct api_dirty_range){ .first_pfn = 2 * i, .nr_pages = 1 };
	vm.ranges = r;
	vm.nr_ranges = n;
	assert_int_equal(request_str(&vm, "GET", "/debug/dirty_pages", NULL, &j), 200);
	assert_true(json_is_true(json_object_get(j, "truncated")));
	assert_int_equal(json_array_size(json_object_get(j, "ranges")), 65536);
	assert_int_equal(json_integer_value(json_object_get(j, "total_pages")), 65536);
	json_decref(j);
	free(r);
}

static void test_malformed_json(void **state)
{
	struct fake_vm vm = fake_running();

	(void)state;
	expect_fault_str(&vm, "PATCH", "/vm", "{\"state\": \"Paused\"", 400, "invalid JSON at line 1");
	expect_fault_str(&vm, "PATCH", "/vm", "{\"state\":\"Paused\"} trailing", 400, "invalid JSON");
	expect_fault_str(&vm, "PATCH", "/vm", "{\"state\":\"Paused\",\"state\":\"Resumed\"}", 400,
			 "duplicate");
	expect_fault_str(&vm, "PATCH", "/vm", "   ", 400, "invalid JSON");
	/* Invalid UTF-8 inside a string. */
	expect_fault_str(&vm, "PATCH", "/vm", "{\"state\":\"\xff\xfe\"}", 400, "invalid JSON");
	assert_int_equal(vm.pauses + vm.resumes, 0);
}

static void test_non_object_body(void **state)
{
	struct fake_vm vm = fake_running();

	(void)state;
	expect_fault_str(&vm, "PATCH", "/vm", "[\"Paused\"]", 400, "must be a JSON object, got an array");
	expect_fault_str(&vm, "PATCH", "/vm", "\"Paused\"", 400, "got a string");
	expect_fault_str(&vm, "PUT", "/actions", "null", 400, "got null");
}

static void test_unknown_field(void **state)
{
	struct fake_vm vm = fake_running();

	(void)state;
	expect_fault_str(&vm, "PATCH", "/vm", "{\"state\":\"Paused\",\"force\":true}", 400, "'force'");
	/* A key whose truncation would split a UTF-8 sequence still yields a valid message. */
	char body[256];
	snprintf(body, sizeof(body), "{\"state\":\"Paused\",\"%s\":1}",
		 "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\xc3\xa9");
	expect_fault_str(&vm, "PATCH", "/vm", body, 400, "unknown field");
	assert_int_equal(vm.pauses, 0);
}

static void test_missing_field(void **state)
{
	struct fake_vm vm = fake_running();

	(void)state;
	expect_fault_str(&vm, "PATCH", "/vm", "{}", 400, "missing required field 'state'");
	expect_fault_str(&vm, "PUT", "/actions", "{}", 400, "'action_type'");
}

static void test_wrong_type(void **state)
{
	struct fake_vm vm = fake_running();

	(void)state;
	expect_fault_str(&vm, "PATCH", "/vm", "{\"state\":1}", 400,
			 "field 'state' must be a string, got an integer");
	expect_fault_str(&vm, "PUT", "/actions", "{\"action_type\":[]}", 400, "got an array");
}

static void test_bad_enum(void **state)
{
	struct fake_vm vm = fake_running();

	(void)state;
	expect_fault_str(&vm, "PATCH", "/vm", "{\"state\":\"Running\"}", 400,
			 "allowed values: Paused, Resumed");
	expect_fault_str(&vm, "PATCH", "/vm", "{\"state\":\"paused\"}", 400, "'paused'");
	assert_int_equal(vm.pauses + vm.resumes, 0);
}

static void test_empty_body(void **state)
{
	struct fake_vm vm = fake_running();

	(void)state;
	expect_fault_str(&vm, "PATCH", "/vm", NULL, 400, "body required");
	expect_fault(&vm, "PUT", "/actions", "", 0, 400, "body required");
}

static void test_oversized_body(void **state)
{
	struct fake_vm vm = fake_running();
	size_t len = API_MAX_BODY + 1;
	char *body = malloc(len);

	(void)state;
	assert_non_null(body);
	memset(body, ' ', len);
	expect_fault(&vm, "PATCH", "/vm", body, len, 413, "limit");

	/* Exactly the limit is still parsed. */
	const char *obj = "{\"state\":\"Paused\"}";
	memcpy(body, obj, strlen(obj));
	json_t *j;
	assert_int_equal(request(&vm, "PATCH", "/vm", body, API_MAX_BODY, &j), 204);
	assert_int_equal(vm.pauses, 1);
	free(body);
}

static void test_nul_byte(void **state)
{
	struct fake_vm vm = fake_running();
	static const char body[] = "{\"state\":\"Paused\0\"}";

	(void)state;
	expect_fault(&vm, "PATCH", "/vm", body, sizeof(body) - 1, 400, "NUL");
	/* The escaped form is refused by jansson itself. */
	expect_fault_str(&vm, "PATCH", "/vm", "{\"state\":\"Paused\\u0000\"}", 400, "invalid JSON");
	assert_int_equal(vm.pauses, 0);
}

static void test_unknown_path(void **state)
{
	struct fake_vm vm = fake_running();

	(void)state;
	expect_fault_str(&vm, "GET", "/machine-config", NULL, 404, "/machine-config");
	expect_fault_str(&vm, "GET", "/vm/", NULL, 404, NULL);
	expect_fault_str(&vm, "GET", "", NULL, 404, NULL);
	/* Non-UTF-8 path bytes still produce a valid JSON fault. */
	expect_fault_str(&vm, "GET", "/\xff\xfe", NULL, 404, "no such resource");
}

static void test_wrong_method(void **state)
{
	struct fake_vm vm = fake_running();

	(void)state;
	expect_fault_str(&vm, "DELETE", "/vm", NULL, 405, "allowed: GET, PATCH");
	expect_fault_str(&vm, "GET", "/actions", NULL, 405, "PUT");
	expect_fault_str(&vm, "POST", "/debug/dirty_pages", NULL, 405, "GET");
	expect_fault_str(&vm, "get", "/vm", NULL, 405, NULL);
}

static void test_backend_errors(void **state)
{
	struct fake_vm vm = fake_running();

	(void)state;
	vm.pause_ret = -EBUSY;
	expect_fault_str(&vm, "PATCH", "/vm", "{\"state\":\"Paused\"}", 409, "pause failed");
	vm.pause_ret = -EALREADY;
	expect_fault_str(&vm, "PATCH", "/vm", "{\"state\":\"Paused\"}", 409, NULL);
	vm.pause_ret = -EIO;
	expect_fault_str(&vm, "PATCH", "/vm", "{\"state\":\"Paused\"}", 500, strerror(EIO));
	vm.pause_ret = -EINVAL;
	expect_fault_str(&vm, "PATCH", "/vm", "{\"state\":\"Paused\"}", 400, NULL);
	vm.cad_ret = -ENOTSUP;
	expect_fault_str(&vm, "PUT", "/actions", "{\"action_type\":\"SendCtrlAltDel\"}", 501, NULL);
	vm.cad_ret = -ENOSYS;
	expect_fault_str(&vm, "PUT", "/actions", "{\"action_type\":\"SendCtrlAltDel\"}", 501, NULL);
	vm.dirty_ret = -ENOMEM;
	expect_fault_str(&vm, "GET", "/debug/dirty_pages", NULL, 500, NULL);
	vm.info_ret = -EIO;
	expect_fault_str(&vm, "GET", "/vm", NULL, 500, "get VM info failed");
	expect_fault_str(&vm, "GET", "/", NULL, 500, NULL);
}

static void test_missing_hooks(void **state)
{
	struct fake_vm vm = fake_running();
	struct api_backend be = { .opaque = &vm, .get_info = fake_get_info };
	struct api_response resp;

	(void)state;
	assert_int_equal(api_handle(&be, "PATCH", "/vm", "{\"state\":\"Paused\"}", 18, &resp), 0);
	assert_int_equal(resp.status, 501);
	free(resp.body);
	assert_int_equal(api_handle(&be, "GET", "/debug/dirty_pages", NULL, 0, &resp), 0);
	assert_int_equal(resp.status, 501);
	free(resp.body);
}

static void test_long_path(void **state)
{
	struct fake_vm vm = fake_running();
	char path[300];

	(void)state;
	memset(path, 'a', sizeof(path));
	path[0] = '/';
	path[sizeof(path) - 1] = '\0';
	expect_fault_str(&vm, "GET", path, NULL, 414, "256");

	/* 256 bytes is within the cap: an ordinary 404. */
	path[256] = '\0';
	expect_fault_str(&vm, "GET", path, NULL, 404, NULL);
}

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
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	struct timeval tv = { .tv_sec = 5 };
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
	int n = snprintf(buf, len, "%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
			 "Content-Length: %zu\r\n\r\n%s", method, path, strlen(body), body);
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
	static const char head[] = "PATCH /vm HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
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
	static const char head[] = "PUT /actions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
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
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
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
	const struct CMUnitTest unit[] = {
		cmocka_unit_test(test_get_vm),
		cmocka_unit_test(test_get_root),
		cmocka_unit_test(test_get_ignores_body_and_query),
		cmocka_unit_test(test_pause_resume),
		cmocka_unit_test(test_pause_idempotent),
		cmocka_unit_test(test_ctrl_alt_del),
		cmocka_unit_test(test_dirty_pages),
		cmocka_unit_test(test_dirty_pages_empty),
		cmocka_unit_test(test_dirty_pages_truncated),
		cmocka_unit_test(test_malformed_json),
		cmocka_unit_test(test_non_object_body),
		cmocka_unit_test(test_unknown_field),
		cmocka_unit_test(test_missing_field),
		cmocka_unit_test(test_wrong_type),
		cmocka_unit_test(test_bad_enum),
		cmocka_unit_test(test_empty_body),
		cmocka_unit_test(test_oversized_body),
		cmocka_unit_test(test_nul_byte),
		cmocka_unit_test(test_unknown_path),
		cmocka_unit_test(test_wrong_method),
		cmocka_unit_test(test_backend_errors),
		cmocka_unit_test(test_missing_hooks),
		cmocka_unit_test(test_long_path),
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
	int failed = cmocka_run_group_tests_name("api", unit, NULL, NULL);

	failed += cmocka_run_group_tests_name("api_http", http, NULL, NULL);
	return failed ? 1 : 0;
}
