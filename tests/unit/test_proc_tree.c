/* lifecycle/proc_tree: a process and its descendants stopped and continued together (the lease
 * keeper's backstop pause of a jailed VMM, whose vCPUs live in its waiter's child). Real
 * processes: a child that forks a grandchild. */
#include "helpers.h"

#include <signal.h>
#include <sys/wait.h>

#include "lifecycle/proc_tree.h"

/* The state letter of /proc/PID/stat ('T' stopped, 'S' sleeping, ...). */
static char state_of(pid_t pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return '?';
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	char *p = strrchr(buf, ')');
	return p && p[1] == ' ' ? p[2] : '?';
}

/* Waits up to 2 s for pid's state to be want. */
static bool becomes(pid_t pid, char want)
{
	for (int i = 0; i < 200; i++) {
		if (state_of(pid) == want)
			return true;
		usleep(10000);
	}
	return false;
}

static void test_stop_cont(void **state)
{
	(void)state;
	int fds[2];
	assert_int_equal(pipe(fds), 0);
	pid_t child = fork();
	assert_true(child >= 0);
	if (child == 0) {
		pid_t gc = fork();
		if (gc == 0) {
			for (;;)
				pause();
		}
		(void)!write(fds[1], &gc, sizeof(gc));
		for (;;)
			pause();
	}
	pid_t gc = 0;
	assert_int_equal(read(fds[0], &gc, sizeof(gc)), (ssize_t)sizeof(gc));
	assert_true(gc > 0);
	assert_int_equal(proc_tree_signal(child, SIGSTOP), 2);
	assert_true(becomes(child, 'T'));
	assert_true(becomes(gc, 'T'));
	assert_int_equal(proc_tree_signal(child, SIGCONT), 2);
	assert_true(becomes(child, 'S'));
	assert_true(becomes(gc, 'S'));
	assert_int_equal(proc_tree_signal(child, SIGKILL), 2);
	int st;
	assert_int_equal(waitpid(child, &st, 0), child);
	assert_true(WIFSIGNALED(st));
	assert_true(becomes(gc, '?') || becomes(gc, 'Z'));
	/* Nobody there. */
	assert_int_equal(proc_tree_signal(child, SIGCONT), -ESRCH);
	assert_int_equal(proc_tree_signal(0, SIGCONT), -EINVAL);
	close(fds[0]);
	close(fds[1]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_stop_cont),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
