/* common/fd_io: whole reads and writes across short transfers; EOF before or after a first byte. */
#include "helpers.h"

#include <sys/socket.h>

#include "common/fd_io.h"

static void test_read_full_eof(void **state)
{
	int sv[2];
	char buf[8];

	(void)state;
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	assert_int_equal(write_full(sv[0], "abc", 3), 0);
	assert_int_equal(read_full(sv[1], buf, 2), 0);
	assert_memory_equal(buf, "ab", 2);
	shutdown(sv[0], SHUT_WR);
	/* One byte left, two asked: EOF after the first byte. */
	assert_int_equal(read_full(sv[1], buf, 2), -EPIPE);
	/* Nothing left: EOF before the first byte. */
	assert_int_equal(read_full(sv[1], buf, 1), -ENODATA);
	close(sv[0]);
	close(sv[1]);
}

static void test_read_upto_stops_at_cap_or_eof(void **state)
{
	int p[2];
	char buf[16];

	(void)state;
	assert_int_equal(pipe(p), 0);
	assert_int_equal(write_full(p[1], "hello world", 11), 0);
	assert_int_equal(read_upto(p[0], buf, 5), 5);
	assert_memory_equal(buf, "hello", 5);
	close(p[1]);
	assert_int_equal(read_upto(p[0], buf, sizeof(buf)), 6);
	assert_memory_equal(buf, " world", 6);
	assert_int_equal(read_upto(p[0], buf, sizeof(buf)), 0);
	close(p[0]);
	assert_true(read_upto(p[0], buf, sizeof(buf)) == -EBADF);
}

/* A write larger than the socket buffer goes out in several sends; a gone peer is -EPIPE, not
 * SIGPIPE. */
static void test_write_full_large_and_gone_peer(void **state)
{
	size_t n = 1 << 20;
	char *out = malloc(n), *in = malloc(n);
	int sv[2];
	pid_t pid;

	(void)state;
	assert_non_null(out);
	assert_non_null(in);
	for (size_t i = 0; i < n; i++)
		out[i] = (char)(i * 7);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(sv[1]);
		_exit(write_full(sv[0], out, n) == 0 ? 0 : 1);
	}
	close(sv[0]);
	assert_int_equal(read_full(sv[1], in, n), 0);
	assert_memory_equal(in, out, n);
	close(sv[1]);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	close(sv[1]);
	assert_int_equal(write_full(sv[0], out, 16), -EPIPE);
	close(sv[0]);
	free(out);
	free(in);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_read_full_eof),
	    cmocka_unit_test(test_read_upto_stops_at_cap_or_eof),
	    cmocka_unit_test(test_write_full_large_and_gone_peer),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
