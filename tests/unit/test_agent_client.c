/* Unit tests: cove's host side of the agent protocol (framing caps, replies, exit frames, the
 * vsock handshake line, sandbox name resolution): malformed and oversize input. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sandbox/agent_client.h"

#define EXITP(s, st) agent_exit_parse(s, strlen(s), st)

static void test_len_parse(void **state)
{
	uint8_t max[4] = {0x00, 0x10, 0x00, 0x00}, over[4] = {0x00, 0x10, 0x00, 0x01};
	uint32_t n;

	(void)state;
	assert_int_equal(wire_len_parse(max, WIRE_MSG_MAX, &n), 0);
	assert_int_equal(n, WIRE_MSG_MAX);
	assert_int_equal(wire_len_parse(over, WIRE_MSG_MAX, &n), -EMSGSIZE);
}

static void test_msg_parse(void **state)
{
	static const char *const bad[] = {"", "nope", "[]", "1", "{\"a\":1", "{\"x\":1}{}",
					  "{\"k\":1,\"k\":2}"};
	char err[256];
	json_t *j;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		assert_int_equal(wire_msg_parse(bad[i], strlen(bad[i]), &j, err, sizeof(err)),
				 -EINVAL);
		assert_true(err[0] && !strchr(err, '\n'));
	}
	assert_int_equal(wire_msg_parse("{\"ok\":true}", 11, &j, err, sizeof(err)), 0);
	assert_true(json_is_true(json_object_get(j, "ok")));
	json_decref(j);
}

static void test_exit_parse(void **state)
{
	int st = -1;

	(void)state;
	assert_int_equal(EXITP("{\"exit_code\":3,\"signal\":0}", &st), 0);
	assert_int_equal(st, 3);
	assert_int_equal(EXITP("{\"exit_code\":-1,\"signal\":9}", &st), 0);
	assert_int_equal(st, 137);
	assert_int_equal(EXITP("{\"exit_code\":0}", &st), 0);
	assert_int_equal(st, 0);
	assert_int_equal(EXITP("{\"exit_code\":256}", &st), -EINVAL);
	assert_int_equal(EXITP("{\"signal\":200}", &st), -EINVAL);
	assert_int_equal(EXITP("{}", &st), -EINVAL);
	assert_int_equal(EXITP("{\"exit_code\":\"0\"}", &st), -EINVAL);
	assert_int_equal(EXITP("garbage", &st), -EINVAL);
}

static void test_connect_reply(void **state)
{
	char err[256];

	(void)state;
	assert_int_equal(agent_connect_reply_parse("OK 1073741824", err, sizeof(err)), 0);
	assert_int_equal(agent_connect_reply_parse("", err, sizeof(err)), -ECONNREFUSED);
	assert_non_null(strstr(err, "not listening"));
	assert_int_equal(agent_connect_reply_parse("NO", err, sizeof(err)), -ECONNREFUSED);
	assert_int_equal(agent_connect_reply_parse("OK ", err, sizeof(err)), -EPROTO);
	assert_int_equal(agent_connect_reply_parse("OK 12x", err, sizeof(err)), -EPROTO);
	/* Found by fuzz_agent_wire (input "&\n"): the peer's bytes went into err as they were, a
	 * newline and terminal escapes included. */
	assert_int_equal(agent_connect_reply_parse("\n", err, sizeof(err)), -ECONNREFUSED);
	assert_null(strchr(err, '\n'));
	assert_int_equal(agent_connect_reply_parse("\x1b]0;pwned\x07\x1b[2J", err, sizeof(err)),
			 -ECONNREFUSED);
	assert_null(strchr(err, '\x1b'));
	assert_int_equal(agent_connect_reply_parse("OK 1\x1b[2J", err, sizeof(err)), -EPROTO);
	assert_null(strchr(err, '\x1b'));
}

/* Framed reads over a real socket pair: oversize, truncated, and a good round trip. */
static void test_msg_read_caps(void **state)
{
	uint8_t over[4] = {0x7f, 0xff, 0xff, 0xff}, five[5] = {WIRE_STDOUT, 0x00, 0x10, 0x00, 0x01};
	char err[256], buf[8];
	json_t *j = NULL, *req = json_pack("{s:s}", "op", "status");
	int sv[2];
	uint8_t type;
	size_t len;

	(void)state;
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	assert_int_equal(write(sv[0], over, 4), 4);
	assert_int_equal(wire_msg_read(sv[1], &j, err, sizeof(err)), -EMSGSIZE);
	assert_non_null(strstr(err, "over"));
	assert_int_equal(wire_msg_write(sv[0], req), 0);
	assert_int_equal(wire_msg_read(sv[1], &j, err, sizeof(err)), 0);
	assert_true(json_equal(j, req));
	json_decref(j);
	json_decref(req);
	assert_int_equal(write(sv[0], five, 5), 5);
	assert_int_equal(wire_data_read(sv[1], &type, buf, SIZE_MAX, &len), -EMSGSIZE);
	close(sv[1]);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	assert_int_equal(wire_data_write(sv[0], WIRE_STDERR, "abc", 3), 0);
	assert_int_equal(wire_data_read(sv[1], &type, buf, sizeof(buf), &len), 0);
	assert_int_equal(type, WIRE_STDERR);
	assert_int_equal(len, 3);
	assert_int_equal(write(sv[0], "\x00\x00\x00\x05{\"a\"", 8), 8);
	close(sv[0]);
	assert_int_equal(wire_msg_read(sv[1], &j, err, sizeof(err)), -EPIPE);
	close(sv[1]);
}

static void test_resolve(void **state)
{
	char dir[] = "/tmp/cove-agent-test.XXXXXX", path[256], uds[AGENT_PATH_MAX], err[256];
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	int fd;

	(void)state;
	assert_non_null(mkdtemp(dir));
	setenv("COVE_RUN_DIR", dir, 1);
	assert_int_equal(agent_state_dir(path, sizeof(path)), 0);
	assert_string_equal(path, dir);
	snprintf(path, sizeof(path), "%s/box1", dir);
	assert_int_equal(mkdir(path, 0700), 0);
	assert_int_equal(agent_resolve("box1", uds, sizeof(uds), err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "no sandbox 'box1'"));
	snprintf(sun.sun_path, sizeof(sun.sun_path), "%s/box1/vsock.sock", dir);
	fd = socket(AF_UNIX, SOCK_STREAM, 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
	assert_int_equal(agent_resolve("box1", uds, sizeof(uds), err, sizeof(err)), 0);
	assert_string_equal(uds, sun.sun_path);
	assert_int_equal(agent_resolve(sun.sun_path, uds, sizeof(uds), err, sizeof(err)), 0);
	assert_int_equal(agent_resolve("..", uds, sizeof(uds), err, sizeof(err)), -EINVAL);
	assert_int_equal(agent_resolve("", uds, sizeof(uds), err, sizeof(err)), -EINVAL);
	assert_int_equal(agent_resolve("/etc/passwd", uds, sizeof(uds), err, sizeof(err)),
			 -ENOTSOCK);
	memset(path, 'x', 200);
	path[200] = '\0';
	assert_int_equal(agent_resolve(path, uds, sizeof(uds), err, sizeof(err)), -ENAMETOOLONG);
	close(fd);
	unlink(sun.sun_path);
	snprintf(path, sizeof(path), "%s/box1", dir);
	rmdir(path);
	rmdir(dir);
	unsetenv("COVE_RUN_DIR");
	setenv("XDG_RUNTIME_DIR", "/run/user/1234", 1);
	assert_int_equal(agent_state_dir(path, sizeof(path)), 0);
	assert_string_equal(path, "/run/user/1234/cove");
}

/* The agent end of the hybrid socket is a plain Unix socket here: a refused CONNECT and a
 * refused identity surface as one-line errors. */
static void test_connect_refused(void **state)
{
	char dir[] = "/tmp/cove-agent-conn.XXXXXX", err[256];
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	int lfd;

	(void)state;
	assert_non_null(mkdtemp(dir));
	snprintf(sun.sun_path, sizeof(sun.sun_path), "%s/v.sock", dir);
	assert_int_equal(agent_connect(sun.sun_path, 0, err, sizeof(err)), -ENOENT);
	lfd = socket(AF_UNIX, SOCK_STREAM, 0);
	assert_int_equal(bind(lfd, (struct sockaddr *)&sun, sizeof(sun)), 0);
	assert_int_equal(listen(lfd, 4), 0);
	if (fork() == 0) {
		/* cove's answer when nothing listens in the guest: it closes the connection */
		int c = accept(lfd, NULL, NULL);
		char line[32];

		if (read(c, line, sizeof(line)) < 0)
			_exit(1);
		close(c);
		_exit(0);
	}
	assert_int_equal(agent_send_identity(sun.sun_path, 1, "00ff", 0, err, sizeof(err)),
			 -ECONNREFUSED);
	assert_non_null(strstr(err, "not listening"));
	close(lfd);
	unlink(sun.sun_path);
	rmdir(dir);
}

/* Against the real agent (cove-init agent --unix, built for the host by meson): identity
 * succeeds and the agent reports the new epoch; a bad token is refused by the agent. */
static void test_identity_real_agent(void **state)
{
	const char *agent = getenv("COVE_INIT_AGENT");
	char dir[] = "/tmp/cove-agent-id.XXXXXX", uds[128], err[256];
	json_t *req, *reply = NULL;
	pid_t pid;
	int fd = -1;

	(void)state;
	if (!agent)
		skip();
	assert_non_null(mkdtemp(dir));
	snprintf(uds, sizeof(uds), "%s/v.sock", dir);
	pid = fork();
	if (pid == 0) {
		execl(agent, agent, "agent", "--unix", uds, (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 100 && access(uds, F_OK) < 0; i++)
		usleep(20000);
	assert_int_equal(agent_send_identity(uds, 42, "00112233445566778899aabbccddeeff", 0, err,
					     sizeof(err)), 0);
	req = json_pack("{s:s}", "op", "status");
	fd = agent_call(uds, 0, req, &reply, err, sizeof(err));
	assert_true(fd >= 0);
	assert_int_equal(json_integer_value(json_object_get(reply, "epoch")), 42);
	assert_null(json_object_get(reply, "token"));
	close(fd);
	json_decref(reply);
	json_decref(req);
	assert_int_equal(agent_send_identity(uds, 43, "not hex", 0, err, sizeof(err)), -EREMOTEIO);
	assert_non_null(strstr(err, "token"));
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	unlink(uds);
	snprintf(uds, sizeof(uds), "%s/v.sock.broker.sock", dir);
	unlink(uds);
	rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_len_parse),    cmocka_unit_test(test_msg_parse),
		cmocka_unit_test(test_exit_parse),   cmocka_unit_test(test_connect_reply),
		cmocka_unit_test(test_msg_read_caps), cmocka_unit_test(test_resolve),
		cmocka_unit_test(test_connect_refused), cmocka_unit_test(test_identity_real_agent),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
