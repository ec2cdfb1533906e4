/* Unit tests for sandbox/phase_hook: restore's test-only pauses (PHASE.reached, wait for PHASE.go).
 */
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>

#include "helpers.h"
#include "file_helpers.h"
#include "common/clock.h"
#include "sandbox/phase_hook.h"

struct fixture {
	char dir[64];
};

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	if (!f)
		return -1;
	snprintf(f->dir, sizeof(f->dir), "/tmp/cove-phase-XXXXXX");
	if (!mkdtemp(f->dir))
		return -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->dir);
	if (system(cmd) != 0)
		return -1;
	free(f);
	return 0;
}

static void path_of(const struct fixture *f, const char *name, char *out, size_t cap)
{
	assert_true(snprintf(out, cap, "%s/%s", f->dir, name) < (int)cap);
}

static bool exists(const struct fixture *f, const char *name)
{
	char p[128];
	struct stat st;
	path_of(f, name, p, sizeof(p));
	return lstat(p, &st) == 0;
}

/* The test side: waits for PHASE.reached, checks it, then creates PHASE.go. */
static void *releaser(void *arg)
{
	struct fixture *f = arg;
	for (int i = 0; i < 5000 && !exists(f, "built.reached"); i++) {
		struct timespec ts = {.tv_nsec = 1000000};
		nanosleep(&ts, NULL);
	}
	if (!exists(f, "built.reached"))
		return NULL;
	struct timespec ts = {.tv_nsec = 50 * 1000000L}; /* really waiting by now */
	nanosleep(&ts, NULL);
	char p[128];
	path_of(f, "built.go", p, sizeof(p));
	int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0600);
	if (fd >= 0)
		close(fd);
	return f;
}

static void test_reached_then_go(void **state)
{
	struct fixture *f = *state;
	char err[256] = "", p[128];
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, releaser, f), 0);
	uint64_t t0 = mono_us();
	assert_int_equal(phase_hook_wait(f->dir, "built", 10000, err, sizeof(err)), 0);
	assert_true(mono_us() - t0 >= 50000); /* it waited for the go */
	void *ok;
	assert_int_equal(pthread_join(t, &ok), 0);
	assert_ptr_equal(ok, f);
	path_of(f, "built.reached", p, sizeof(p));
	struct stat st;
	assert_int_equal(lstat(p, &st), 0);
	assert_true(S_ISREG(st.st_mode));
	assert_int_equal(st.st_mode & 0777, 0600);
	size_t n;
	char *body = (char *)read_file(p, &n);
	body[n] = 0;
	assert_int_equal(atoi(body), (int)getpid());
	free(body);
}

/* A go that is already there (a test lets earlier phases pass): no wait; a stale reached is
 * truncated and rewritten. */
static void test_go_already_there(void **state)
{
	struct fixture *f = *state;
	char err[256] = "", p[128];
	path_of(f, "opened.reached", p, sizeof(p));
	write_file(p, "stale stale stale stale stale\n", 30);
	path_of(f, "opened.go", p, sizeof(p));
	write_file(p, "", 0);
	assert_int_equal(phase_hook_wait(f->dir, "opened", 10000, err, sizeof(err)), 0);
	path_of(f, "opened.reached", p, sizeof(p));
	size_t n;
	char *body = (char *)read_file(p, &n);
	body[n] = 0;
	assert_int_equal(atoi(body), (int)getpid());
	assert_null(strstr(body, "stale"));
	free(body);
	/* The hook as restore calls it, and nothing at all without a directory. */
	assert_int_equal(
	    phase_hook(f->dir, "opened", &(struct logger){.level = LOG_ERROR, .out = stderr}), 0);
	assert_int_equal(phase_hook(NULL, "opened", NULL), 0);
}

static void test_timeout(void **state)
{
	struct fixture *f = *state;
	char err[256] = "";
	uint64_t t0 = mono_us();
	assert_int_equal(phase_hook_wait(f->dir, "state", 60, err, sizeof(err)), -ETIMEDOUT);
	uint64_t dt = mono_us() - t0;
	assert_true(dt >= 60000 && dt < 5000000);
	assert_true(exists(f, "state.reached"));
	assert_non_null(strstr(err, "state.go"));
	assert_null(strchr(err, '\n'));
}

/* A link planted as PHASE.reached is refused and its target left alone. */
static void test_symlink_refused(void **state)
{
	struct fixture *f = *state;
	char err[256] = "", target[128], link[128];
	path_of(f, "target", target, sizeof(target));
	write_file(target, "keep\n", 5);
	path_of(f, "started.reached", link, sizeof(link));
	assert_int_equal(symlink(target, link), 0);
	path_of(f, "started.go", link, sizeof(link));
	write_file(link, "", 0);
	assert_int_equal(phase_hook_wait(f->dir, "started", 1000, err, sizeof(err)), -ELOOP);
	assert_non_null(strstr(err, "started.reached"));
	size_t n;
	char *body = (char *)read_file(target, &n);
	assert_int_equal(n, 5);
	assert_memory_equal(body, "keep\n", 5);
	free(body);
	/* A dangling link too: nothing is created through it. */
	char dangling[128];
	path_of(f, "nowhere", dangling, sizeof(dangling));
	path_of(f, "built.reached", link, sizeof(link));
	assert_int_equal(symlink(dangling, link), 0);
	assert_int_equal(phase_hook_wait(f->dir, "built", 50, err, sizeof(err)), -ELOOP);
	assert_false(exists(f, "nowhere"));
	/* phase_hook returns it: restore stops rather than running unpaused. */
	assert_int_equal(
	    phase_hook(f->dir, "built", &(struct logger){.level = LOG_ERROR, .out = stderr}),
	    -ELOOP);
}

/* Not a regular file (a directory, a FIFO) under the reached name: refused, never blocked on. */
static void test_not_regular_refused(void **state)
{
	struct fixture *f = *state;
	char err[256] = "", p[128];
	path_of(f, "state.reached", p, sizeof(p));
	assert_int_equal(mkfifo(p, 0600), 0);
	assert_true(phase_hook_wait(f->dir, "state", 50, err, sizeof(err)) <
		    0); /* ENXIO: no reader */
	assert_non_null(strstr(err, "state.reached"));
	path_of(f, "built.reached", p, sizeof(p));
	assert_int_equal(mkdir(p, 0700), 0);
	assert_true(phase_hook_wait(f->dir, "built", 50, err, sizeof(err)) < 0);
}

static void test_bad_dir_or_phase(void **state)
{
	struct fixture *f = *state;
	char err[256] = "", p[128];
	path_of(f, "file", p, sizeof(p));
	write_file(p, "x", 1);
	assert_int_equal(phase_hook_wait(p, "opened", 50, err, sizeof(err)), -ENOTDIR);
	assert_null(strchr(err, '\n'));
	path_of(f, "missing", p, sizeof(p));
	assert_int_equal(phase_hook_wait(p, "opened", 50, err, sizeof(err)), -ENOENT);
	/* A directory others may write is refused (they could plant links in it). */
	assert_int_equal(chmod(f->dir, 0770), 0);
	assert_int_equal(phase_hook_wait(f->dir, "opened", 50, err, sizeof(err)), -EPERM);
	assert_int_equal(chmod(f->dir, 0700), 0);
	assert_int_equal(phase_hook_wait(f->dir, "a/b", 50, err, sizeof(err)), -EINVAL);
	assert_int_equal(phase_hook_wait(f->dir, "", 50, err, sizeof(err)), -EINVAL);
	assert_int_equal(phase_hook_wait(f->dir, "..", 50, err, sizeof(err)), -EINVAL);
	assert_false(exists(f, "opened.reached"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_reached_then_go, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_go_already_there, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_timeout, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_symlink_refused, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_not_regular_refused, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_bad_dir_or_phase, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
