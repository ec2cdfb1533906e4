/* A sandbox's store counters (lifecycle/store_stats.c): sums, a file that is not JSON, and
 * additions from several processes at once, none lost. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "lifecycle/store_stats.h"

static int dir_new(char *path, size_t cap)
{
	snprintf(path, cap, "/tmp/cove-stats-XXXXXX");
	assert_non_null(mkdtemp(path));
	int dfd = open(path, O_RDONLY | O_DIRECTORY);
	assert_true(dfd >= 0);
	return dfd;
}

static void dir_rm(const char *path)
{
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", path);
	assert_int_equal(system(cmd), 0);
}

static void test_sums(void **state)
{
	(void)state;
	char path[64];
	int dfd = dir_new(path, sizeof(path));
	struct store_stats s;
	assert_int_equal(store_stats_load(dfd, &s), 0);
	assert_int_equal(s.uploaded_bytes + s.commits + s.generation, 0);
	assert_int_equal(store_stats_add(dfd, &(struct store_stats){.uploaded_bytes = 100,
								    .commits = 1,
								    .generation = 7,
								    .last_commit_ms = 1000}),
			 0);
	assert_int_equal(
	    store_stats_add(dfd, &(struct store_stats){.uploaded_bytes = 50, .renewals = 2}), 0);
	assert_int_equal(store_stats_load(dfd, &s), 0);
	assert_int_equal(s.uploaded_bytes, 150);
	assert_int_equal(s.commits, 1);
	assert_int_equal(s.renewals, 2);
	assert_int_equal(s.generation, 7); /* kept: the second update set none */
	assert_int_equal(s.last_commit_ms, 1000);
	close(dfd);
	dir_rm(path);
}

static void test_garbage(void **state)
{
	(void)state;
	char path[64];
	int dfd = dir_new(path, sizeof(path));
	int fd = openat(dfd, STORE_STATS_FILE, O_WRONLY | O_CREAT, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "{\"commits\": -5, \"renewals\": \"x\", \"takeovers\": 3", 48),
			 48);
	close(fd);
	struct store_stats s;
	assert_int_equal(store_stats_load(dfd, &s), 0); /* not JSON: zeros */
	assert_int_equal(s.takeovers, 0);
	assert_int_equal(store_stats_add(dfd, &(struct store_stats){.takeovers = 1}), 0);
	assert_int_equal(store_stats_load(dfd, &s), 0);
	assert_int_equal(s.takeovers, 1);
	close(dfd);
	dir_rm(path);
}

static void test_concurrent(void **state)
{
	(void)state;
	enum { PROCS = 4, EACH = 50 };
	char path[64];
	int dfd = dir_new(path, sizeof(path));
	for (int p = 0; p < PROCS; p++) {
		pid_t pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) {
			for (int i = 0; i < EACH; i++)
				if (store_stats_add(dfd, &(struct store_stats){.fetched_bytes = 3}))
					_exit(1);
			_exit(0);
		}
	}
	for (int p = 0; p < PROCS; p++) {
		int st;
		assert_true(wait(&st) > 0);
		assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	struct store_stats s;
	assert_int_equal(store_stats_load(dfd, &s), 0);
	assert_int_equal(s.fetched_bytes, PROCS * EACH * 3);
	close(dfd);
	dir_rm(path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_sums),
	    cmocka_unit_test(test_garbage),
	    cmocka_unit_test(test_concurrent),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
