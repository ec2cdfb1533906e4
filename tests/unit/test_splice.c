/* common/splice, common/accept_serve: both ways, half-closes passed on, a thread per connection. */
#include "helpers.h"

#include <pthread.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "common/accept_serve.h"
#include "common/fd_io.h"
#include "common/splice.h"

struct splice_arg {
	int a, b;
};

static void *splice_thread(void *arg)
{
	struct splice_arg *s = arg;

	fd_splice(s->a, s->b);
	return NULL;
}

/* client <-> [x  splice  y] <-> server: data both ways, then each side's EOF reaches the other. */
static void test_splice_both_ways_and_half_close(void **state)
{
	int c[2], s[2];
	struct splice_arg arg;
	pthread_t th;
	char buf[16];

	(void)state;
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, c), 0);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, s), 0);
	arg = (struct splice_arg){.a = c[1], .b = s[1]};
	assert_int_equal(pthread_create(&th, NULL, splice_thread, &arg), 0);
	assert_int_equal(write_full(c[0], "ping", 4), 0);
	assert_int_equal(read_full(s[0], buf, 4), 0);
	assert_memory_equal(buf, "ping", 4);
	/* The client is done sending: the server sees EOF, and can still answer. */
	shutdown(c[0], SHUT_WR);
	assert_int_equal(read_upto(s[0], buf, sizeof(buf)), 0);
	assert_int_equal(write_full(s[0], "pong", 4), 0);
	shutdown(s[0], SHUT_WR);
	assert_int_equal(read_upto(c[0], buf, sizeof(buf)), 4);
	assert_memory_equal(buf, "pong", 4);
	/* Both directions ended: the splice returns. */
	assert_int_equal(pthread_join(th, NULL), 0);
	close(c[0]);
	close(c[1]);
	close(s[0]);
	close(s[1]);
}

/* Echoes one message back, then closes: runs on its own thread per connection. */
static void echo_serve(void *ctx, int fd)
{
	char buf[64];
	ssize_t n = read(fd, buf, sizeof(buf));

	(void)ctx;
	if (n > 0)
		write_full(fd, buf, (size_t)n);
	close(fd);
}

struct serve_arg {
	int lfd;
};

static void *serve_thread(void *arg)
{
	accept_serve(((struct serve_arg *)arg)->lfd, echo_serve, NULL);
}

static void test_accept_serve_concurrent(void **state)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	struct serve_arg arg;
	int lfd, fds[4];
	pthread_t th;

	(void)state;
	snprintf(sun.sun_path, sizeof(sun.sun_path), "/tmp/cove-accept-%d.sock", (int)getpid());
	unlink(sun.sun_path);
	lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(lfd >= 0);
	assert_int_equal(bind(lfd, (struct sockaddr *)&sun, sizeof(sun)), 0);
	assert_int_equal(listen(lfd, 8), 0);
	arg.lfd = lfd;
	assert_int_equal(pthread_create(&th, NULL, serve_thread, &arg), 0);
	pthread_detach(th); /* accept_serve never returns; the process exit ends it */
	/* All connected before any sends: each is served on its own thread. */
	for (int i = 0; i < 4; i++) {
		fds[i] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		assert_true(fds[i] >= 0);
		assert_int_equal(connect(fds[i], (struct sockaddr *)&sun, sizeof(sun)), 0);
	}
	for (int i = 3; i >= 0; i--) {
		char msg[8], buf[8];

		snprintf(msg, sizeof(msg), "conn%d", i);
		assert_int_equal(write_full(fds[i], msg, 5), 0);
		assert_int_equal(read_upto(fds[i], buf, sizeof(buf)), 5);
		assert_memory_equal(buf, msg, 5);
		close(fds[i]);
	}
	unlink(sun.sun_path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_splice_both_ways_and_half_close),
	    cmocka_unit_test(test_accept_serve_concurrent),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
