/* Unit tests for common/unix_sock: connect by path, refusals, the deadline. */
#include "helpers.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>

#include "common/unix_sock.h"

static int listen_at(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(fd, 4), 0);
	return fd;
}

static void test_connects_with_deadline(void **state)
{
	(void)state;
	char path[64];
	struct timeval tv;
	socklen_t len = sizeof(tv);
	snprintf(path, sizeof(path), "/tmp/cove-unix-sock-%d", (int)getpid());
	unlink(path);
	int l = listen_at(path);
	int fd = unix_connect(path, 0, 1.5);
	assert_true(fd >= 0);
	assert_int_equal(getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &len), 0);
	assert_int_equal(tv.tv_sec, 1);
	assert_true(tv.tv_usec >= 499000 && tv.tv_usec <= 501000);
	assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	close(fd);
	fd = unix_connect(path, SOCK_NONBLOCK, 0); /* no deadline asked: none set */
	assert_true(fd >= 0);
	assert_true(fcntl(fd, F_GETFL) & O_NONBLOCK);
	len = sizeof(tv);
	assert_int_equal(getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &len), 0);
	assert_int_equal(tv.tv_sec, 0);
	assert_int_equal(tv.tv_usec, 0);
	close(fd);
	close(l);
	unlink(path);
}

static void test_refusals(void **state)
{
	(void)state;
	char longp[200];
	memset(longp, 'a', sizeof(longp) - 1);
	longp[0] = '/';
	longp[sizeof(longp) - 1] = '\0';
	assert_int_equal(unix_connect(longp, 0, 0), -ENAMETOOLONG);
	assert_int_equal(unix_connect("/nonexistent/cove.sock", 0, 0), -ENOENT);
	assert_int_equal(unix_connect("/tmp", 0, 0), -ECONNREFUSED);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_connects_with_deadline),
		cmocka_unit_test(test_refusals),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
