/* Unit tests for sandbox/api: the control API handler (routes, JSON bodies, faults) against a fake
 * VM. */
#include <jansson.h>

#include "api_fake.h"

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
static void expect_fault(struct fake_vm *vm, const char *method, const char *path, const char *body,
			 size_t len, int status, const char *needle)
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
	assert_int_equal(
	    request_str(&vm, "PUT", "/actions", "{\"action_type\":\"SendCtrlAltDel\"}", &j), 204);
	assert_null(j);
	assert_int_equal(vm.cads, 1);

	expect_fault_str(&vm, "PUT", "/actions", "{\"action_type\":\"FlushMetrics\"}", 400,
			 "SendCtrlAltDel");
	assert_int_equal(vm.cads, 1);
}

static void test_balloon(void **state)
{
	struct fake_vm vm = fake_running();
	json_t *j;

	(void)state;
	expect_fault_str(&vm, "GET", "/balloon", NULL, 400, "no balloon");
	expect_fault_str(&vm, "PATCH", "/balloon", "{\"amount_mib\":1}", 400, "no balloon");
	vm.has_balloon = true;
	assert_int_equal(request_str(&vm, "PATCH", "/balloon", "{\"amount_mib\":64}", &j), 204);
	assert_int_equal(vm.balloon_mib, 64);
	assert_int_equal(request_str(&vm, "GET", "/balloon", NULL, &j), 200);
	assert_int_equal(json_integer_value(json_object_get(j, "amount_mib")), 64);
	assert_int_equal(json_integer_value(json_object_get(j, "actual_pages")), 512);
	assert_int_equal(json_integer_value(json_object_get(j, "reported_bytes")), 150 << 20);
	assert_true(json_is_true(json_object_get(j, "free_page_reporting")));
	json_decref(j);
	assert_int_equal(request_str(&vm, "GET", "/balloon/statistics", NULL, &j), 200);
	assert_int_equal(json_integer_value(json_object_get(j, "free_memory")), 4242);
	assert_null(json_object_get(j, "total_memory"));
	assert_int_equal(json_integer_value(json_object_get(j, "actual_mib")), 2);
	json_decref(j);
	/* Bad targets never reach the backend. */
	expect_fault_str(&vm, "PATCH", "/balloon", "{\"amount_mib\":-1}", 400, "amount_mib");
	expect_fault_str(&vm, "PATCH", "/balloon", "{\"amount_mib\":99999999}", 400, "amount_mib");
	expect_fault_str(&vm, "PATCH", "/balloon", "{\"amount_mib\":\"8\"}", 400, "amount_mib");
	expect_fault_str(&vm, "PATCH", "/balloon", "{}", 400, "amount_mib");
	expect_fault_str(&vm, "PATCH", "/balloon", "{\"amount_mib\":1,\"x\":2}", 400, NULL);
	expect_fault_str(&vm, "PUT", "/balloon", "{}", 405, NULL);
	assert_int_equal(vm.balloon_sets, 1);
}

static void test_dirty_pages(void **state)
{
	static const struct api_dirty_range r[] = {{0, 3}, {100, 1}, {1ull << 40, 16}};
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
		r[i] = (struct api_dirty_range){.first_pfn = 2 * i, .nr_pages = 1};
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
	expect_fault_str(&vm, "PATCH", "/vm", "{\"state\": \"Paused\"", 400,
			 "invalid JSON at line 1");
	expect_fault_str(&vm, "PATCH", "/vm", "{\"state\":\"Paused\"} trailing", 400,
			 "invalid JSON");
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
	expect_fault_str(&vm, "PATCH", "/vm", "[\"Paused\"]", 400,
			 "must be a JSON object, got an array");
	expect_fault_str(&vm, "PATCH", "/vm", "\"Paused\"", 400, "got a string");
	expect_fault_str(&vm, "PUT", "/actions", "null", 400, "got null");
}

static void test_unknown_field(void **state)
{
	struct fake_vm vm = fake_running();

	(void)state;
	expect_fault_str(&vm, "PATCH", "/vm", "{\"state\":\"Paused\",\"force\":true}", 400,
			 "'force'");
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
	struct api_backend be = {.opaque = &vm, .get_info = fake_get_info};
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

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_get_vm),
	    cmocka_unit_test(test_get_root),
	    cmocka_unit_test(test_get_ignores_body_and_query),
	    cmocka_unit_test(test_pause_resume),
	    cmocka_unit_test(test_pause_idempotent),
	    cmocka_unit_test(test_ctrl_alt_del),
	    cmocka_unit_test(test_balloon),
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
	};
	return cmocka_run_group_tests_name("api", tests, NULL, NULL);
}
