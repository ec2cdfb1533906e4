/* cove exec/start/... of a sandbox only the store has: cove-store pulls it first. */
#include "cli/store_reconnect.h"
#include "lifecycle/gc.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

bool store_is_configured(void)
{
	const char *cfg = getenv("COVE_STORE");
	return (cfg && *cfg) || access("/etc/cove/store.json", R_OK) == 0;
}

/* cove-store beside this executable into path[cap]; 0 or -1. */
static int store_exe(char *path, size_t cap)
{
	char self[4096];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n < 0)
		return -1;
	self[n] = 0;
	char *slash = strrchr(self, '/');
	if (slash)
		*slash = 0;
	return (size_t)snprintf(path, cap, "%s/cove-store", slash ? self : ".") < cap ? 0 : -1;
}

/* The exit status of child `pid` (1 when it died of a signal), or -1. */
static int wait_status(pid_t pid)
{
	int status;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

/* A child's signals as a new process's: cove up blocks SIGTERM for its signalfd. */
static void child_signals(void)
{
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
}

/* cove-store SUB NAME [EXTRA]: its exit status, or -1 without a store (or without cove-store). */
static int store_run_extra(const char *sub, const char *name, const char *extra)
{
	char path[4200];
	if (!store_is_configured() || store_exe(path, sizeof(path)))
		return -1;
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		child_signals();
		/* Its one-line summary is not this command's output: stdout to /dev/null. */
		int nul = open("/dev/null", O_WRONLY | O_CLOEXEC);
		if (nul >= 0)
			dup2(nul, 1);
		char *argv[] = {path, (char *)sub, (char *)name, (char *)extra, NULL};
		/* cove says "was removed" itself: cove-store's own line would repeat it. */
		setenv("COVE_STORE_QUIET_REMOVED", "1", 1);
		execv(path, argv);
		fprintf(stderr, "cove: cannot run %s: %s\n", path, strerror(errno));
		_exit(127);
	}
	return wait_status(pid);
}

static int store_run(const char *sub, const char *name)
{
	return store_run_extra(sub, name, NULL);
}

int store_try_template(const char *sub, const char *name)
{
	return store_run_extra(sub, name, "--template");
}

int store_try_evict(const char *max, bool dry_run)
{
	char path[4200];
	if (!store_is_configured() || store_exe(path, sizeof(path)))
		return -1;
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		child_signals();
		/* Its lines (one per eviction) are cove gc's own output: stdout kept. */
		char *argv[6] = {path, (char *)"evict"};
		int n = 2;
		if (max) {
			argv[n++] = (char *)"--cache-max";
			argv[n++] = (char *)max;
		}
		if (dry_run)
			argv[n++] = (char *)"--dry-run";
		argv[n] = NULL;
		execv(path, argv);
		fprintf(stderr, "cove: cannot run %s: %s\n", path, strerror(errno));
		_exit(127);
	}
	return wait_status(pid);
}

int store_try_pull(const char *name)
{
	return store_run("pull", name);
}

int store_try_tombstone(const char *name)
{
	return store_run("tombstone", name);
}

int store_try_take(const char *name)
{
	return store_run("take", name);
}

int store_try_held(const char *name)
{
	return store_run("held", name);
}

static int gc_may_collect(const char *name)
{
	int r = store_run("owner", name);
	return r < 0 ? 0 : r;
}

static void gc_deleted(const char *name)
{
	store_try_tombstone(name);
}

const struct sbx_gc_hooks *store_gc_hooks(void)
{
	static const struct sbx_gc_hooks hooks = {.may_collect = gc_may_collect,
						  .deleted = gc_deleted};
	return store_is_configured() ? &hooks : NULL;
}

int store_try_release(const char *name)
{
	return store_run("release", name);
}

int store_try_push(const char *name)
{
	return store_run("push", name);
}

/* The store's catalog is at most this much JSON (100000 sandboxes of ~150 bytes). */
#define STORE_LIST_CAP (16u << 20)

int store_try_list(char **json_out)
{
	char path[4200];
	*json_out = NULL;
	if (!store_is_configured() || store_exe(path, sizeof(path)))
		return -1;
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0)
		return 1;
	pid_t pid = fork();
	if (pid < 0) {
		close(p[0]);
		close(p[1]);
		return 1;
	}
	if (pid == 0) {
		child_signals();
		dup2(p[1], 1);
		char *argv[] = {path, (char *)"ls", (char *)"--json", NULL};
		execv(path, argv);
		fprintf(stderr, "cove: cannot run %s: %s\n", path, strerror(errno));
		_exit(127);
	}
	close(p[1]);
	size_t len = 0, cap = 0;
	char *buf = NULL;
	bool over = false;
	for (;;) {
		if (len + 65536 + 1 > cap) {
			size_t ncap = cap ? cap * 2 : 65536 + 1;
			char *nb = ncap <= STORE_LIST_CAP + 65536 + 1 ? realloc(buf, ncap) : NULL;
			if (!nb) {
				over = true;
				break;
			}
			buf = nb;
			cap = ncap;
		}
		ssize_t n = read(p[0], buf + len, 65536);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
		if (len > STORE_LIST_CAP) {
			over = true;
			break;
		}
	}
	close(p[0]);
	int status;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR) {
			status = 1 << 8;
			break;
		}
	if (over || !WIFEXITED(status) || WEXITSTATUS(status)) {
		if (over)
			fprintf(stderr, "cove: the store's catalog is over %u bytes; not shown\n",
				STORE_LIST_CAP);
		free(buf);
		return 1;
	}
	buf[len] = 0;
	*json_out = buf;
	return 0;
}

/*
 * cove-store ARGS in a session of its own, detached (a grandchild: it outlives this command),
 * its output appended to NAME/store.log; `keep` >= 0 is passed on at fd 3. 0 or -errno.
 */
static int spawn_store(int dfd, char *const argv[], int keep)
{
	pid_t pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		child_signals();
		setsid();
		if (fork() != 0)
			_exit(0);
		int log = openat(dfd, "store.log",
				 O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
		int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
		if (nul >= 0)
			dup2(nul, 0);
		if (log >= 0) {
			dup2(log, 1);
			dup2(log, 2);
		}
		if (keep >= 0 && keep != 3 && dup2(keep, 3) < 0)
			_exit(127);
		if (keep == 3)
			fcntl(3, F_SETFD, 0);
		execv(argv[0], argv);
		_exit(127);
	}
	while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
		;
	return 0;
}

void store_start_follower(int dfd, const char *name)
{
	char path[4200];
	if (!store_is_configured() || store_exe(path, sizeof(path)))
		return;
	/* Its own session, not this command's child: it lives as long as the VMM. */
	char *argv[] = {path, (char *)"follow", (char *)name, NULL};
	spawn_store(dfd, argv, -1);
}

int store_start_lazy(int dfd, const char *name, int sock)
{
	char path[4200];
	if (!store_is_configured())
		return -ENOKEY;
	if (store_exe(path, sizeof(path)))
		return -ENAMETOOLONG;
	/* It fetches on after this command, and after the VMM, until the copy is whole. */
	char *argv[] = {path, (char *)"lazy", (char *)name, (char *)"--fd", (char *)"3", NULL};
	return spawn_store(dfd, argv, sock);
}
