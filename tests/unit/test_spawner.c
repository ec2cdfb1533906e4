/* The clone spawner: it starts `cove restore ARGS` (here: this test binary, as /proc/self/exe)
 * with the ready pipe as fd 3 and nothing else of ours, answers with a pidfd, refuses other
 * commands and key providers, and ends with its socket; a filtered process can use it. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "sandbox/seccomp_filters.h"
#include "sandbox/spawner.h"

/*
 * The "clone": this binary started by the spawner as `cove restore ARGS`. It writes its
 * arguments to fd 3, then whether fd 4 (anything else of its parent's) is open and whether
 * stdin is /dev/null, and exits.
 */
static int clone_main(int argc, char **argv)
{
	char line[1024];
	size_t n = 0;
	for (int i = 1; i < argc && n < sizeof(line); i++)
		n += (size_t)snprintf(line + n, sizeof(line) - n, "%s ", argv[i]);
	struct stat in, null;
	bool stdin_null = fstat(0, &in) == 0 && stat("/dev/null", &null) == 0 &&
			  in.st_rdev == null.st_rdev && S_ISCHR(in.st_mode);
	dprintf(3, "%sfd4=%s stdin=%s\n", line, fcntl(4, F_GETFD) < 0 ? "closed" : "open",
		stdin_null ? "null" : "other");
	return 0;
}

/* Reads the clone's line from the pipe (until EOF). */
static void read_line(int fd, char *buf, size_t cap)
{
	size_t got = 0;
	ssize_t m;
	while (got < cap - 1 && (m = read(fd, buf + got, cap - 1 - got)) > 0)
		got += (size_t)m;
	buf[got] = 0;
}

/* True once the pidfd says the process exited (within 10 s). */
static bool exited(int pidfd)
{
	struct pollfd p = {.fd = pidfd, .events = POLLIN};
	return poll(&p, 1, 10000) == 1;
}

static void spawn_expect(struct spawner *sp, const char *const argv[], const char *want)
{
	int pfd[2];
	assert_int_equal(pipe2(pfd, O_CLOEXEC), 0);
	/* An fd of ours without close-on-exec: the clone must not get it. */
	int leak = open("/dev/null", O_RDONLY);
	assert_true(leak >= 0);
	int pid = 0, pidfd = -1;
	assert_int_equal(spawner_spawn(sp, argv, pfd[1], &pid, &pidfd), 0);
	close(leak);
	close(pfd[1]);
	assert_true(pid > 0 && pidfd >= 0);
	char buf[1024];
	read_line(pfd[0], buf, sizeof(buf));
	close(pfd[0]);
	assert_string_equal(buf, want);
	assert_true(exited(pidfd));
	close(pidfd);
}

static void test_spawns_restore_with_fd3_only(void **state)
{
	(void)state;
	struct spawner sp;
	assert_int_equal(spawner_start(&sp, NULL, -1), 0);
	const char *argv[] = {"cove", "restore", "/chain", "--layer", "7", NULL};
	spawn_expect(&sp, argv, "restore /chain --layer 7 fd4=closed stdin=null\n");
	/* Again: the spawner serves one request after another. */
	const char *argv2[] = {"cove", "restore", "/other", NULL};
	spawn_expect(&sp, argv2, "restore /other fd4=closed stdin=null\n");
	spawner_stop(&sp);
	/* From an fd of the binary, as in a jail (no /proc there); that fd is not the clone's. */
	int exe = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
	assert_true(exe >= 0);
	assert_int_equal(spawner_start(&sp, NULL, exe), 0);
	close(exe);
	spawn_expect(&sp, argv2, "restore /other fd4=closed stdin=null\n");
	/* A jailed VMM's clone asks for the binary as its fd 4, for clones of its own. */
	const char *exe4[] = {"cove", "restore", "/c", "--exe-fd", "4", NULL};
	spawn_expect(&sp, exe4, "restore /c --exe-fd 4 fd4=open stdin=null\n");
	spawner_stop(&sp);
	assert_int_equal(spawner_start(&sp, NULL, 999), -EBADF);
}

static void test_refuses(void **state)
{
	(void)state;
	struct spawner sp;
	assert_int_equal(spawner_start(&sp, "key-cmd:/bin/good", -1), 0);
	int pid = 0, pidfd = -1;
	const char *run[] = {"cove", "run", "--kernel", "/x", NULL};
	const char *sh[] = {"/bin/sh", "restore", NULL};
	const char *bad_key[] = {"cove", "restore", "/c", "--key", "key-cmd:/bin/evil", NULL};
	const char *eq_key[] = {"cove", "restore", "/c", "--key=key-cmd:/bin/good", NULL};
	const char *abbrev[] = {"cove", "restore", "/c", "--ke", "key-cmd:/bin/good", NULL};
	const char *no_val[] = {"cove", "restore", "/c", "--key", NULL};
	const char *dashdash[] = {"cove", "restore", "--", "/c", NULL};
	const char *no_filter[] = {"cove", "restore", "/c", "--no-seccomp", NULL};
	const char *no_filter_abbrev[] = {"cove", "restore", "/c", "--no-sec", NULL};
	/* fd 4 is the binary and nothing else: no other number, no abbreviation, no '='. */
	const char *exe5[] = {"cove", "restore", "/c", "--exe-fd", "5", NULL};
	const char *exe_abbrev[] = {"cove", "restore", "/c", "--exe", "4", NULL};
	const char *exe_eq[] = {"cove", "restore", "/c", "--exe-fd=4", NULL};
	const char *const *refused[] = {run,	    sh,	      bad_key,	 eq_key,	   abbrev,
					no_val,	    dashdash, no_filter, no_filter_abbrev, exe5,
					exe_abbrev, exe_eq};
	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
		assert_int_equal(spawner_spawn(&sp, refused[i], -1, &pid, &pidfd), -EPERM);
	/* Its own key is fine. */
	const char *good[] = {"cove", "restore", "/c", "--key", "key-cmd:/bin/good", NULL};
	spawn_expect(&sp, good, "restore /c --key key-cmd:/bin/good fd4=closed stdin=null\n");
	spawner_stop(&sp);
	/* Without a key, no --key at all. */
	assert_int_equal(spawner_start(&sp, NULL, -1), 0);
	assert_int_equal(spawner_spawn(&sp, good, -1, &pid, &pidfd), -EPERM);
	spawner_stop(&sp);
}

/* A clone's disks are exactly its parent's, in order: never a committed layer made a disk. */
static void test_disks_only_the_parents(void **state)
{
	(void)state;
	struct spawner sp;
	struct spawner_disks *d = calloc(1, sizeof(*d));
	assert_non_null(d);
	d->nr = 2;
	snprintf(d->arg[0], sizeof(d->arg[0]), "/img/root.ext4,ro");
	snprintf(d->arg[1], sizeof(d->arg[1]), "/img/work.ext4,bw=1048576");
	assert_int_equal(spawner_start_disks(&sp, NULL, d, -1), 0);
	free(d); /* the spawner keeps its own copy */
	int pid = 0, pidfd = -1;
	const char *layer[] = {"cove", "restore", "/c", "--disk", "/c/mem-000003", NULL};
	const char *rw[] = {"cove", "restore", "/c", "--disk", "/img/root.ext4", NULL};
	const char *order[] = {
	    "cove",   "restore",	   "/c", "--disk", "/img/work.ext4,bw=1048576",
	    "--disk", "/img/root.ext4,ro", NULL};
	const char *third[] = {"cove",
			       "restore",
			       "/c",
			       "--disk",
			       "/img/root.ext4,ro",
			       "--disk",
			       "/img/work.ext4,bw=1048576",
			       "--disk",
			       "/c/state-000003",
			       NULL};
	const char *eq[] = {"cove", "restore", "/c", "--disk=/img/root.ext4,ro", NULL};
	const char *abbrev[] = {"cove", "restore", "/c", "--di", "/img/root.ext4,ro", NULL};
	const char *const *refused[] = {layer, rw, order, third, eq, abbrev};
	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
		assert_int_equal(spawner_spawn(&sp, refused[i], -1, &pid, &pidfd), -EPERM);
	const char *good[] = {"cove",
			      "restore",
			      "/c",
			      "--disk",
			      "/img/root.ext4,ro",
			      "--disk",
			      "/img/work.ext4,bw=1048576",
			      NULL};
	spawn_expect(&sp, good,
		     "restore /c --disk /img/root.ext4,ro --disk /img/work.ext4,bw=1048576 "
		     "fd4=closed stdin=null\n");
	spawner_stop(&sp);
	/* Started without a list (spawner_start): no --disk at all. */
	assert_int_equal(spawner_start(&sp, NULL, -1), 0);
	assert_int_equal(spawner_spawn(&sp, good, -1, &pid, &pidfd), -EPERM);
	spawner_stop(&sp);
}

static void test_too_long_and_stopped(void **state)
{
	(void)state;
	struct spawner sp;
	assert_int_equal(spawner_start(&sp, NULL, -1), 0);
	int spid = sp.pid;
	char *big = malloc(SPAWNER_MSG_MAX);
	assert_non_null(big);
	memset(big, 'a', SPAWNER_MSG_MAX - 1);
	big[SPAWNER_MSG_MAX - 1] = 0;
	const char *argv[] = {"cove", "restore", big, NULL};
	int pid = 0, pidfd = -1;
	assert_int_equal(spawner_spawn(&sp, argv, -1, &pid, &pidfd), -E2BIG);
	free(big);
	spawner_stop(&sp);
	/* Reaped: the pid no longer names a process of ours. */
	assert_int_equal(waitpid(spid, NULL, WNOHANG), -1);
	assert_int_equal(errno, ECHILD);
	assert_int_equal(spawner_spawn(&sp, argv, -1, &pid, &pidfd), -ENOTCONN);
	spawner_stop(&sp); /* twice is fine */
}

/* The VMM's case: the spawner forked first, then the event loop's filter, then a clone. */
static void test_from_a_filtered_process(void **state)
{
	(void)state;
	if (seccomp_sanitized_build())
		skip();
	int errp[2];
	assert_int_equal(pipe(errp), 0);
	pid_t c = fork();
	assert_true(c >= 0);
	if (c == 0) {
		close(errp[0]);
		struct spawner sp;
		char err[256];
		if (spawner_start(&sp, NULL, -1) || seccomp_trap_init() ||
		    seccomp_install(SECCOMP_EVLOOP, err, sizeof(err)))
			_exit(20);
		int pfd[2];
		if (pipe2(pfd, O_CLOEXEC))
			_exit(21);
		const char *argv[] = {"cove", "restore", "/filtered", NULL};
		int pid, pidfd;
		int r = spawner_spawn(&sp, argv, pfd[1], &pid, &pidfd);
		if (r)
			_exit(22);
		close(pfd[1]);
		char buf[256];
		read_line(pfd[0], buf, sizeof(buf));
		if (strcmp(buf, "restore /filtered fd4=closed stdin=null\n") || !exited(pidfd))
			_exit(23);
		spawner_stop(&sp);
		_exit(0);
	}
	close(errp[1]);
	int st;
	assert_int_equal(waitpid(c, &st, 0), c);
	char msg[512];
	read_line(errp[0], msg, sizeof(msg));
	close(errp[0]);
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		fail_msg("filtered child: status %#x, stderr %s", st, msg);
}

int main(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "restore"))
		return clone_main(argc, argv);
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_spawns_restore_with_fd3_only),
	    cmocka_unit_test(test_refuses),
	    cmocka_unit_test(test_disks_only_the_parents),
	    cmocka_unit_test(test_too_long_and_stopped),
	    cmocka_unit_test(test_from_a_filtered_process),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
