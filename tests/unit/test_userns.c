/* common/userns.c: a user namespace where the caller's ids appear as the ones asked for. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/userns.h"

#define NOBODY 65534

/* Child: what it saw, as a bit set (0 = all as expected); 77 when no user namespace here. */
enum { BAD_IDS = 1, BAD_UIDMAP = 2, BAD_GIDMAP = 4, BAD_DUMPABLE = 8, BAD_SETGROUPS = 16 };

static int read_line(const char *path, char *buf, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = read(fd, buf, cap - 1);
	close(fd);
	if (n < 0)
		return -errno;
	buf[n] = '\0';
	return 0;
}

/* "  0  65534  1\n" -> three numbers. */
static int map_is(const char *path, unsigned in, unsigned out)
{
	char buf[128];
	unsigned a, b, c;

	return read_line(path, buf, sizeof(buf)) == 0 && sscanf(buf, "%u %u %u", &a, &b, &c) == 3 &&
	       a == in && b == out && c == 1;
}

static int child(uid_t as_uid, gid_t as_gid, uid_t in_uid, gid_t in_gid)
{
	char buf[64];
	int bad = 0, r;

	if (as_uid != geteuid() && (setgid(as_gid) || setuid(as_uid)))
		return 99;
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	r = userns_enter(in_uid, in_gid);
	if (r == -EPERM || r == -EINVAL || r == -ENOSPC || r == -EACCES)
		return 77;
	if (r)
		return 98;
	if (geteuid() != in_uid || getegid() != in_gid)
		bad |= BAD_IDS;
	if (!map_is("/proc/self/uid_map", in_uid, as_uid))
		bad |= BAD_UIDMAP;
	if (!map_is("/proc/self/gid_map", in_gid, as_gid))
		bad |= BAD_GIDMAP;
	if (prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0)
		bad |= BAD_DUMPABLE;
	if (read_line("/proc/self/setgroups", buf, sizeof(buf)) || strncmp(buf, "deny", 4))
		bad |= BAD_SETGROUPS;
	return bad;
}

static int run_child(uid_t as_uid, gid_t as_gid, uid_t in_uid, gid_t in_gid)
{
	int st;
	pid_t p = fork();

	if (p == 0)
		_exit(child(as_uid, as_gid, in_uid, in_gid));
	assert_true(p > 0);
	assert_int_equal(waitpid(p, &st, 0), p);
	assert_true(WIFEXITED(st));
	return WEXITSTATUS(st);
}

/* An unprivileged process (nobody, when run as root) maps itself to root inside. */
static void test_maps_self_to_root(void **state)
{
	(void)state;
	uid_t u = geteuid() == 0 ? NOBODY : geteuid();
	gid_t g = geteuid() == 0 ? NOBODY : getegid();
	int r = run_child(u, g, 0, 0);

	if (r == 77)
		skip();
	assert_int_equal(r, 0);
}

/* ... or to its own ids, as cove-broker --confine does. */
static void test_maps_self_to_self(void **state)
{
	(void)state;
	uid_t u = geteuid() == 0 ? NOBODY : geteuid();
	gid_t g = geteuid() == 0 ? NOBODY : getegid();
	int r = run_child(u, g, u, g);

	if (r == 77)
		skip();
	assert_int_equal(r, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_maps_self_to_root),
	    cmocka_unit_test(test_maps_self_to_self),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
