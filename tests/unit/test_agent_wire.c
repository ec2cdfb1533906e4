/* Unit tests: cove-init agent's side of the host<->agent protocol (framing, exec requests,
 * base64, /etc/passwd lookup): malformed and oversize input. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <sys/un.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

#include "agent.h"
#include "common/base64.h"
#include "cove-init.h"

static json_t *parse(const char *s)
{
	char err[256];
	json_t *j = NULL;

	assert_int_equal(wire_msg_parse(s, strlen(s), &j, err, sizeof(err)), 0);
	return j;
}

static void test_len_caps(void **state)
{
	uint8_t ok[4] = {0x00, 0x10, 0x00, 0x00}, big[4] = {0x00, 0x10, 0x00, 0x01};
	uint8_t huge[4] = {0xff, 0xff, 0xff, 0xff};
	uint32_t n = 0;

	(void)state;
	assert_int_equal(wire_len_parse(ok, WIRE_MSG_MAX, &n), 0);
	assert_int_equal(n, 1u << 20);
	assert_int_equal(wire_len_parse(big, WIRE_MSG_MAX, &n), -EMSGSIZE);
	assert_int_equal(wire_len_parse(huge, WIRE_MSG_MAX, &n), -EMSGSIZE);
}

static void test_msg_parse_malformed(void **state)
{
	static const char *const bad[] = {"", "{", "[1,2]", "\"str\"", "42", "{\"a\":1} x",
					  "{\"a\":1,\"a\":2}", "{\"a\":\"\xff\xfe\"}", "null"};
	char err[256];
	json_t *j = NULL;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		assert_int_equal(wire_msg_parse(bad[i], strlen(bad[i]), &j, err, sizeof(err)),
				 -EINVAL);
		assert_true(strlen(err) > 0 && !strchr(err, '\n'));
	}
	j = parse("{\"op\":\"status\"}");
	assert_string_equal(json_string_value(json_object_get(j, "op")), "status");
	json_decref(j);
}

/* Over a real socket pair: an announced length over the cap is refused before any read. */
static void test_msg_read_oversize(void **state)
{
	int sv[2];
	uint8_t hdr[4] = {0x00, 0x10, 0x00, 0x01};
	char err[256];
	json_t *j = NULL;

	(void)state;
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	assert_int_equal(write(sv[0], hdr, 4), 4);
	assert_int_equal(wire_msg_read(sv[1], &j, err, sizeof(err)), -EMSGSIZE);
	assert_non_null(strstr(err, "too large"));
	/* truncated body */
	hdr[1] = 0;
	hdr[3] = 10;
	assert_int_equal(write(sv[0], hdr, 4), 4);
	assert_int_equal(write(sv[0], "{\"a\"", 4), 4);
	close(sv[0]);
	assert_int_equal(wire_msg_read(sv[1], &j, err, sizeof(err)), -EPIPE);
	close(sv[1]);
}

static void test_msg_roundtrip_and_data_frames(void **state)
{
	int sv[2];
	char err[256], buf[16];
	json_t *j = json_pack("{s:s,s:i}", "op", "forward", "port", 80), *got = NULL;
	uint8_t type, hdr[5] = {WIRE_STDIN, 0x00, 0x10, 0x00, 0x01};
	size_t len;

	(void)state;
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	assert_int_equal(wire_msg_write(sv[0], j), 0);
	assert_int_equal(wire_msg_read(sv[1], &got, err, sizeof(err)), 0);
	assert_true(json_equal(j, got));
	json_decref(got);
	json_decref(j);
	assert_int_equal(wire_data_write(sv[0], WIRE_STDOUT, "hello", 5), 0);
	assert_int_equal(wire_data_read(sv[1], &type, buf, sizeof(buf), &len), 0);
	assert_int_equal(type, WIRE_STDOUT);
	assert_int_equal(len, 5);
	assert_memory_equal(buf, "hello", 5);
	/* a frame larger than the reader's buffer */
	assert_int_equal(wire_data_write(sv[0], WIRE_STDOUT, "0123456789abcdefX", 17), 0);
	assert_int_equal(wire_data_read(sv[1], &type, buf, sizeof(buf), &len), -EMSGSIZE);
	close(sv[1]);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	/* a frame over the protocol's 1 MiB, whatever the buffer */
	assert_int_equal(write(sv[0], hdr, 5), 5);
	assert_int_equal(wire_data_read(sv[1], &type, buf, SIZE_MAX, &len), -EMSGSIZE);
	assert_int_equal(wire_data_write(sv[0], WIRE_STDOUT, buf, WIRE_DATA_MAX + 1), -EMSGSIZE);
	close(sv[0]);
	close(sv[1]);
}

static void expect_exec_error(const char *json, const char *want)
{
	struct exec_req r;
	char err[256] = "";
	json_t *j = parse(json);

	assert_true(exec_req_parse(j, &r, err, sizeof(err)) < 0);
	if (!strstr(err, want))
		fail_msg("'%s': error '%s' lacks '%s'", json, err, want);
	json_decref(j);
}

static void test_exec_req(void **state)
{
	struct exec_req r;
	char err[256], *big;
	json_t *j;

	(void)state;
	j = parse("{\"op\":\"exec\",\"argv\":[\"sh\",\"-c\",\"echo hi\"],\"env\":[\"A=1\",\"B=\"],"
		  "\"cwd\":\"/tmp\",\"user\":\"1000\",\"tty\":true,\"stdin\":false,\"rows\":40,"
		  "\"cols\":120}");
	assert_int_equal(exec_req_parse(j, &r, err, sizeof(err)), 0);
	assert_string_equal(r.argv[0], "sh");
	assert_string_equal(r.argv[2], "echo hi");
	assert_null(r.argv[3]);
	assert_string_equal(r.env[1], "B=");
	assert_null(r.env[2]);
	assert_string_equal(r.cwd, "/tmp");
	assert_string_equal(r.user, "1000");
	assert_true(r.tty);
	assert_false(r.stdin_open);
	assert_int_equal(r.rows, 40);
	assert_int_equal(r.cols, 120);
	json_decref(j);
	j = parse("{\"argv\":[\"true\"]}");
	assert_int_equal(exec_req_parse(j, &r, err, sizeof(err)), 0);
	assert_true(r.stdin_open);
	assert_false(r.tty);
	assert_null(r.cwd);
	assert_null(r.env[0]);
	json_decref(j);

	expect_exec_error("{}", "argv");
	expect_exec_error("{\"argv\":[]}", "argv");
	expect_exec_error("{\"argv\":\"ls\"}", "argv");
	expect_exec_error("{\"argv\":[\"ls\",3]}", "argv[1]");
	expect_exec_error("{\"argv\":[\"\"]}", "argv[0]");
	expect_exec_error("{\"argv\":[\"ls\"],\"env\":[\"NOEQ\"]}", "env[0]");
	expect_exec_error("{\"argv\":[\"ls\"],\"env\":[\"=x\"]}", "env[0]");
	expect_exec_error("{\"argv\":[\"ls\"],\"env\":{\"A\":\"1\"}}", "env");
	expect_exec_error("{\"argv\":[\"ls\"],\"tty\":1}", "tty");
	expect_exec_error("{\"argv\":[\"ls\"],\"stdin\":\"yes\"}", "stdin");
	expect_exec_error("{\"argv\":[\"ls\"],\"cwd\":\"\"}", "cwd");
	expect_exec_error("{\"argv\":[\"ls\"],\"user\":7}", "user");
	expect_exec_error("{\"argv\":[\"ls\"],\"rows\":-1}", "rows");
	expect_exec_error("{\"argv\":[\"ls\"],\"cols\":70000}", "cols");

	/* an embedded NUL (JSON "\u0000" with JSON_ALLOW_NUL on the sender's side) */
	j = json_pack("{s:[s#]}", "argv", "a\0b", (size_t)3);
	assert_int_equal(exec_req_parse(j, &r, err, sizeof(err)), -EINVAL);
	json_decref(j);

	/* too many arguments, and one argument over the length cap */
	j = json_pack("{s:[]}", "argv");
	for (int i = 0; i <= EXEC_ARGS_MAX; i++)
		json_array_append_new(json_object_get(j, "argv"), json_string("x"));
	assert_int_equal(exec_req_parse(j, &r, err, sizeof(err)), -E2BIG);
	json_decref(j);
	big = malloc(EXEC_ARG_LEN_MAX + 2);
	memset(big, 'a', EXEC_ARG_LEN_MAX + 1);
	big[EXEC_ARG_LEN_MAX + 1] = '\0';
	j = json_pack("{s:[s,s]}", "argv", "echo", big);
	assert_int_equal(exec_req_parse(j, &r, err, sizeof(err)), -EINVAL);
	json_decref(j);
	free(big);
}

/* "rlimits" of the exec op: known types once each, soft <= hard, -1 unlimited, at most 32. */
static void test_exec_req_rlimits(void **state)
{
	struct exec_req r;
	char err[256];
	json_t *j;

	(void)state;
	j = parse("{\"argv\":[\"sh\"],\"rlimits\":[{\"type\":\"RLIMIT_NOFILE\",\"soft\":123,"
		  "\"hard\":456},{\"type\":\"RLIMIT_CORE\",\"soft\":0,\"hard\":-1}]}");
	assert_int_equal(exec_req_parse(j, &r, err, sizeof(err)), 0);
	assert_int_equal(r.nrlimits, 2);
	assert_int_equal(r.rlimits[0].resource, RLIMIT_NOFILE);
	assert_int_equal(r.rlimits[0].soft, 123);
	assert_int_equal(r.rlimits[0].hard, 456);
	assert_int_equal(r.rlimits[1].resource, RLIMIT_CORE);
	assert_true(r.rlimits[1].hard == RLIMIT_UNLIMITED);
	json_decref(j);

	expect_exec_error("{\"argv\":[\"sh\"],\"rlimits\":{}}", "rlimits: not an array");
	expect_exec_error("{\"argv\":[\"sh\"],\"rlimits\":[{\"type\":\"RLIMIT_BOGUS\","
			  "\"soft\":1,\"hard\":1}]}",
			  "rlimits[0].type");
	expect_exec_error("{\"argv\":[\"sh\"],\"rlimits\":[{\"type\":7,\"soft\":1,\"hard\":1}]}",
			  "rlimits[0].type");
	expect_exec_error("{\"argv\":[\"sh\"],\"rlimits\":[{\"type\":\"RLIMIT_NOFILE\","
			  "\"soft\":9,\"hard\":8}]}",
			  "soft limit over the hard one");
	expect_exec_error("{\"argv\":[\"sh\"],\"rlimits\":[{\"type\":\"RLIMIT_NOFILE\","
			  "\"soft\":-1,\"hard\":8}]}",
			  "soft limit over the hard one");
	expect_exec_error("{\"argv\":[\"sh\"],\"rlimits\":[{\"type\":\"RLIMIT_NOFILE\","
			  "\"soft\":-2,\"hard\":8}]}",
			  "rlimits[0].soft");
	expect_exec_error("{\"argv\":[\"sh\"],\"rlimits\":[{\"type\":\"RLIMIT_NOFILE\","
			  "\"soft\":1}]}",
			  "rlimits[0].hard");
	expect_exec_error(
	    "{\"argv\":[\"sh\"],\"rlimits\":[{\"type\":\"RLIMIT_NOFILE\","
	    "\"soft\":1,\"hard\":1},{\"type\":\"RLIMIT_NOFILE\",\"soft\":1,\"hard\":1}]}",
	    "there twice");
	j = json_pack("{s:[s],s:[]}", "argv", "sh", "rlimits");
	for (int i = 0; i <= RLIMITS_MAX; i++)
		json_array_append_new(
		    json_object_get(j, "rlimits"),
		    json_pack("{s:s,s:i,s:i}", "type", "RLIMIT_CPU", "soft", 1, "hard", 1));
	assert_int_equal(exec_req_parse(j, &r, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "at most 32"));
	json_decref(j);
}

static void test_b64(void **state)
{
	unsigned char in[64], back[64];
	char enc[100];
	size_t n;

	(void)state;
	for (size_t i = 0; i < sizeof(in); i++)
		in[i] = (unsigned char)(i * 37 + 11);
	for (size_t len = 0; len <= sizeof(in); len++) {
		b64_encode(in, len, enc);
		assert_int_equal(strlen(enc), b64_enc_len(len));
		assert_int_equal(b64_decode_loose(enc, strlen(enc), back, sizeof(back), &n), 0);
		assert_int_equal(n, len);
		assert_memory_equal(in, back, len);
	}
	b64_encode((const unsigned char *)"foobar", 6, enc);
	assert_string_equal(enc, "Zm9vYmFy");
	b64_encode((const unsigned char *)"fo", 2, enc);
	assert_string_equal(enc, "Zm8=");
}

static void test_passwd(void **state)
{
	static const char pw[] = "root:x:0:0:root:/root:/bin/sh\n"
				 "broken line\n"
				 "bad:x:notanumber:0::/:/bin/sh\n"
				 "short:x:1:1\n"
				 "alice:x:1000:100:Alice:/home/alice:/bin/ash\n"
				 "last:x:1001:1001::/home/last:/bin/sh"; /* no final newline */
	struct pw_ent e;

	(void)state;
	assert_int_equal(passwd_find(pw, strlen(pw), "root", &e), 0);
	assert_int_equal(e.uid, 0);
	assert_string_equal(e.home, "/root");
	assert_int_equal(passwd_find(pw, strlen(pw), "alice", &e), 0);
	assert_int_equal(e.uid, 1000);
	assert_int_equal(e.gid, 100);
	assert_string_equal(e.home, "/home/alice");
	assert_string_equal(e.shell, "/bin/ash");
	assert_int_equal(passwd_find(pw, strlen(pw), "1000", &e), 0);
	assert_string_equal(e.name, "alice");
	assert_int_equal(passwd_find(pw, strlen(pw), "last", &e), 0);
	assert_int_equal(e.uid, 1001);
	assert_int_equal(passwd_find(pw, strlen(pw), "bad", &e), -ENOENT);
	assert_int_equal(passwd_find(pw, strlen(pw), "short", &e), -ENOENT);
	assert_int_equal(passwd_find(pw, strlen(pw), "nobody", &e), -ENOENT);
	assert_int_equal(passwd_find(pw, strlen(pw), "ali", &e), -ENOENT);
	/* a uid without an entry still runs, as in docker */
	assert_int_equal(passwd_find(pw, strlen(pw), "4242", &e), 0);
	assert_int_equal(e.uid, 4242);
	assert_int_equal(e.gid, 4242);
	assert_string_equal(e.home, "/");
	assert_int_equal(passwd_find(pw, strlen(pw), "99999999999", &e), -ENOENT);
	assert_int_equal(passwd_find("", 0, "root", &e), -ENOENT);
}

/* Only the host's CID may drive the agent; a guest process over vsock loopback may not. */
static void test_peer_allowed(void **state)
{
	struct sockaddr_vm vm = {.svm_family = AF_VSOCK, .svm_port = 5000};
	struct sockaddr_un un = {.sun_family = AF_UNIX};
	struct sockaddr_in in = {.sin_family = AF_INET};

	(void)state;
	vm.svm_cid = VMADDR_CID_HOST;
	assert_true(wire_peer_allowed((struct sockaddr *)&vm, sizeof(vm), false));
	vm.svm_cid = VMADDR_CID_LOCAL; /* vsock loopback */
	assert_false(wire_peer_allowed((struct sockaddr *)&vm, sizeof(vm), false));
	vm.svm_cid = 3; /* the guest's own CID */
	assert_false(wire_peer_allowed((struct sockaddr *)&vm, sizeof(vm), false));
	vm.svm_cid = VMADDR_CID_HYPERVISOR;
	assert_false(wire_peer_allowed((struct sockaddr *)&vm, sizeof(vm), false));
	vm.svm_cid = VMADDR_CID_ANY;
	assert_false(wire_peer_allowed((struct sockaddr *)&vm, sizeof(vm), false));
	vm.svm_cid = VMADDR_CID_HOST;
	assert_false(wire_peer_allowed((struct sockaddr *)&vm, sizeof(vm) - 1, false));
	assert_false(wire_peer_allowed((struct sockaddr *)&vm, 0, false));
	assert_false(wire_peer_allowed(NULL, sizeof(vm), false));
	/* A vsock listener never takes a Unix or IP peer, and test mode only a Unix one. */
	assert_false(wire_peer_allowed((struct sockaddr *)&un, sizeof(un), false));
	assert_false(wire_peer_allowed((struct sockaddr *)&in, sizeof(in), false));
	assert_true(wire_peer_allowed((struct sockaddr *)&un, sizeof(sa_family_t), true));
	assert_false(wire_peer_allowed((struct sockaddr *)&vm, sizeof(vm), true));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_len_caps),
		cmocka_unit_test(test_msg_parse_malformed),
		cmocka_unit_test(test_msg_read_oversize),
		cmocka_unit_test(test_msg_roundtrip_and_data_frames),
		cmocka_unit_test(test_exec_req),
		cmocka_unit_test(test_exec_req_rlimits),
		cmocka_unit_test(test_b64),
		cmocka_unit_test(test_passwd),
		cmocka_unit_test(test_peer_allowed),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
