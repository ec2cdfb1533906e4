/* lifecycle/: sandbox names, the state root, lock files held across exec and ended by kill -9,
 * the event log (torn last line) and the state read from lock and log. Real files and processes. */
#include "helpers.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "file_helpers.h"
#include "lifecycle/events.h"
#include "lifecycle/lock.h"
#include "lifecycle/name.h"
#include "lifecycle/root.h"
#include "lifecycle/state.h"

struct fx {
	char dir[64];
	struct sbx_root root;
};

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	char err[256];

	strcpy(f->dir, "/tmp/cove-life-XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	setenv("COVE_STATE_DIR", f->dir, 1);
	setenv("COVE_RUN_DIR", "/tmp/cove-life-run", 1);
	assert_int_equal(sbx_root_open(&f->root, false, err, sizeof(err)), 0);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;
	char cmd[128];

	sbx_root_close(&f->root);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", f->dir);
	assert_int_equal(system(cmd), 0);
	free(f);
	return 0;
}

static void test_names(void **state)
{
	static const char *const good[] = {"a", "0", "agent-7", "x-",
					   "abcdefghijklmnopqrstuvwxyz0123456789-abcdefghijk"};
	static const char *const bad[] = {
	    "",	   "-a", "A",	"a_b", "a.b",
	    "a/b", "..", "a b", "é",   "abcdefghijklmnopqrstuvwxyz0123456789-abcdefghijkl"};
	char err[256];

	(void)state;
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		assert_int_equal(sbx_name_check(good[i], err, sizeof(err)), 0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		assert_int_equal(sbx_name_check(bad[i], err, sizeof(err)), -EINVAL);
		assert_one_line_error(err, "name");
	}
	assert_int_equal(sbx_name_check(NULL, err, sizeof(err)), -EINVAL);
}

static void test_root_and_dirs(void **state)
{
	struct fx *f = *state;
	struct sbx_root r2;
	char err[256], path[256], link[128];
	struct stat st;
	int fd;

	/* A sandbox directory is created once, 0700, and opened again by name. */
	fd = sbx_dir_open(&f->root, "one", true, err, sizeof(err));
	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0700);
	close(fd);
	assert_int_equal(sbx_dir_open(&f->root, "one", true, err, sizeof(err)), -EEXIST);
	assert_one_line_error(err, "already exists");
	fd = sbx_dir_open(&f->root, "one", false, err, sizeof(err));
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(sbx_dir_open(&f->root, "two", false, err, sizeof(err)), -ENOENT);
	assert_one_line_error(err, "no sandbox named two");
	assert_int_equal(sbx_dir_open(&f->root, "../etc", false, err, sizeof(err)), -EINVAL);

	/* A link planted where a sandbox directory should be is not followed. */
	snprintf(link, sizeof(link), "%s/evil", f->dir);
	assert_int_equal(symlink("/tmp", link), 0);
	assert_true(sbx_dir_open(&f->root, "evil", false, err, sizeof(err)) < 0);

	/* Socket paths fit; a run directory too long for them is refused up front. */
	assert_int_equal(sbx_run_path(&f->root, "one", "vsock.sock", path, sizeof(path)), 0);
	assert_string_equal(path, "/tmp/cove-life-run/one/vsock.sock");
	setenv("COVE_RUN_DIR", "/tmp/a-runtime-directory-whose-path-is-far-too-long", 1);
	assert_int_equal(sbx_root_open(&r2, false, err, sizeof(err)), -ENAMETOOLONG);
	assert_one_line_error(err, "COVE_RUN_DIR");

	/* A state root others can write is refused (they could plant links in it). */
	setenv("COVE_RUN_DIR", "/tmp/cove-life-run", 1);
	assert_int_equal(chmod(f->dir, 0777), 0);
	assert_true(sbx_root_open(&r2, false, err, sizeof(err)) < 0);
	assert_one_line_error(err, NULL);
	assert_int_equal(chmod(f->dir, 0700), 0);
}

/* Forks a process that takes the VMM lock and execs sleep with it: the lock outlives exec. */
static pid_t hold_lock_across_exec(int dfd)
{
	int ready[2];
	char c;
	pid_t pid;

	assert_int_equal(pipe(ready), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int fd = sbx_lock_take(dfd, SBX_LOCK_VMM, false, true);

		if (fd < 0)
			_exit(1);
		if (write(ready[1], "x", 1) != 1)
			_exit(1);
		execlp("sleep", "sleep", "60", (char *)NULL);
		_exit(1);
	}
	close(ready[1]);
	assert_int_equal(read(ready[0], &c, 1), 1);
	close(ready[0]);
	usleep(100 * 1000); /* past the exec */
	return pid;
}

static void test_locks(void **state)
{
	struct fx *f = *state;
	char err[256];
	int dfd = sbx_dir_open(&f->root, "lk", true, err, sizeof(err));
	int status, fd;
	pid_t pid;

	assert_true(dfd >= 0);
	assert_int_equal(sbx_lock_held(dfd, SBX_LOCK_VMM), 0); /* no file yet */
	pid = hold_lock_across_exec(dfd);
	assert_int_equal(sbx_lock_held(dfd, SBX_LOCK_VMM), 1);
	assert_int_equal(sbx_lock_take(dfd, SBX_LOCK_VMM, false, false), -EWOULDBLOCK);
	/* kill -9 ends the lock with the process: nothing is left to clean up. */
	assert_int_equal(kill(pid, SIGKILL), 0);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_int_equal(sbx_lock_held(dfd, SBX_LOCK_VMM), 0);
	fd = sbx_lock_take(dfd, SBX_LOCK_VMM, false, false);
	assert_true(fd >= 0);
	assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	close(fd);
	/* A link in place of a lock file is refused. */
	assert_int_equal(symlinkat("/tmp/x", dfd, SBX_LOCK_START), 0);
	assert_true(sbx_lock_take(dfd, SBX_LOCK_START, false, false) < 0);
	close(dfd);
}

static void test_events_and_state(void **state)
{
	struct fx *f = *state;
	struct sbx_event ev;
	enum sbx_state st;
	char err[256], path[256];
	int dfd = sbx_dir_open(&f->root, "ev", true, err, sizeof(err));
	int status, fd;
	pid_t pid;

	assert_true(dfd >= 0);
	assert_int_equal(sbx_event_last(dfd, &ev), -ENOENT);
	assert_int_equal(sbx_state_read(dfd, &st, NULL), 0);
	assert_int_equal(st, SBX_CREATING);

	/* Running per the log, and its process holds the lock. */
	assert_int_equal(sbx_event_append(dfd, "creating", "running", "cove create"), 0);
	pid = hold_lock_across_exec(dfd);
	assert_int_equal(sbx_state_read(dfd, &st, &ev), 0);
	assert_int_equal(st, SBX_RUNNING);
	assert_string_equal(ev.from, "creating");
	assert_string_equal(ev.cause, "cove create");
	assert_true(ev.time_ms > 1700000000000LL);

	/* The process died without a stop: crashed. */
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	assert_int_equal(sbx_state_read(dfd, &st, NULL), 0);
	assert_int_equal(st, SBX_CRASHED);

	/* A stop, then a torn line a crash left mid-write: the last whole line counts. */
	assert_int_equal(sbx_event_append(dfd, "running", "stopped", "cove stop"), 0);
	snprintf(path, sizeof(path), "%s/ev/%s", f->dir, SBX_EVENTS);
	fd = open(path, O_WRONLY | O_APPEND);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "{\"time\":\"20", 11), 11);
	close(fd);
	assert_int_equal(sbx_state_read(dfd, &st, &ev), 0);
	assert_int_equal(st, SBX_STOPPED);
	assert_string_equal(ev.to, "stopped");

	/* A last line that is not an event is an error, not a guess. */
	fd = open(path, O_WRONLY | O_APPEND);
	assert_int_equal(write(fd, "\n{\"to\":\"elsewhere\"}\n", 20), 20);
	close(fd);
	assert_int_equal(sbx_state_read(dfd, &st, NULL), -EINVAL);
	close(dfd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_names),
	    cmocka_unit_test_setup_teardown(test_root_and_dirs, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_locks, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_events_and_state, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
