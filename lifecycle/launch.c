/* fork/exec of a sandbox's VMM with its life lock inherited. */
#include "lifecycle/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/errmsg.h"
#include "common/file_io.h"
#include "lifecycle/lock.h"
#include "lifecycle/vmm_args.h"
#include "sandbox/idle.h"

/* In the child: everything up to exec; on failure the errno goes up the pipe. */
/* fd moved to a number above both inherited slots, close-on-exec; -1 on failure. */
static int move_high(int fd)
{
	int to;

	if (fd != SBX_LOCK_FD && fd != SBX_READY_FD && fd != SBX_LAZY_FD)
		return fd;
	to = fcntl(fd, F_DUPFD_CLOEXEC, SBX_LOCK_FD + 1);
	return to;
}

static void child(int dfd, char *const argv[], int ready_wr, int lazy, int report)
{
	sigset_t none;
	int lk, nul, log, e;

	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	signal(SIGPIPE, SIG_DFL);
	setsid();
	/* SBX_LOCK_FD and SBX_READY_FD are the inherited ones: the others go elsewhere first. */
	report = move_high(report);
	if (report < 0)
		_exit(127);
	if (ready_wr >= 0) {
		ready_wr = move_high(ready_wr);
		if (ready_wr < 0) {
			e = errno;
			goto fail;
		}
	}
	if (lazy >= 0 && (lazy = move_high(lazy)) < 0) {
		e = errno;
		goto fail;
	}
	if ((dfd = move_high(dfd)) < 0) {
		e = errno;
		goto fail;
	}
	lk = sbx_lock_take(dfd, SBX_LOCK_VMM, false, true);
	if (lk < 0) {
		e = -lk;
		goto fail;
	}
	/* At a known number, so that a jailed VMM keeps it (--jail-keep-fd); inherited. */
	if (lk != SBX_LOCK_FD) {
		if (dup2(lk, SBX_LOCK_FD) < 0) {
			e = errno;
			goto fail;
		}
		close(lk);
		lk = SBX_LOCK_FD;
	}
	/* dup2 leaves the new fd open across exec. */
	if (ready_wr >= 0 && dup2(ready_wr, SBX_READY_FD) < 0) {
		e = errno;
		goto fail;
	}
	if (lazy >= 0 && dup2(lazy, SBX_LAZY_FD) < 0) {
		e = errno;
		goto fail;
	}
	/* The jailed VMM's root is mounted on this empty directory (vmm_args.c). */
	if (mkdirat(dfd, SBX_JAIL_DIR, 0700) < 0 && errno != EEXIST) {
		e = errno;
		goto fail;
	}
	e = -sbx_lock_write_pid(dfd, SBX_LOCK_VMM, getpid());
	if (e)
		goto fail;
	/*
	 * The chain directory exists before the jail binds it (else the jail would bind its
	 * parent, the sandbox's own directory); an idle stop's note of an earlier run goes.
	 */
	if (mkdirat(dfd, SBX_CHAIN, 0700) < 0 && errno != EEXIST) {
		e = errno;
		goto fail;
	}
	int cdfd = openat(dfd, SBX_CHAIN, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (cdfd >= 0) {
		(void)unlinkat(cdfd, SBX_IDLE_NOTE, 0);
		close(cdfd);
	}
	nul = open("/dev/null", O_RDWR | O_CLOEXEC);
	log =
	    openat(dfd, SBX_VMM_LOG, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (nul < 0 || log < 0 || dup2(nul, 0) < 0 || dup2(nul, 1) < 0 || dup2(log, 2) < 0) {
		e = errno;
		goto fail;
	}
	char exe[4096];

	e = -sbx_vmm_exe(exe, sizeof(exe));
	if (e)
		goto fail;
	execv(exe, argv);
	e = errno;
fail:
	if (write(report, &e, sizeof(e)) < 0)
		_exit(127);
	_exit(127);
}

int sbx_vmm_exe(char *out, size_t cap)
{
	char self[4096];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	if (n < 0)
		return -errno;
	if ((size_t)n >= sizeof(self) - 1)
		return -ENAMETOOLONG;
	self[n] = '\0';
	char *slash = strrchr(self, '/');

	if (!slash)
		return -ENOENT;
	slash[1] = '\0';
	if ((size_t)snprintf(out, cap, "%s%s", self, SBX_VMM_EXE) >= cap)
		return -ENAMETOOLONG;
	return 0;
}

int sbx_spawn(void (*fn)(void *arg, int report), void *arg, pid_t *pid, int *child_errno, char *err,
	      size_t errlen)
{
	int pfd[2], e = 0;
	ssize_t n;
	pid_t p;

	*child_errno = 0;
	if (pipe2(pfd, O_CLOEXEC) < 0)
		return errmsg(err, errlen, -errno, "pipe: %s", strerror(errno));
	p = fork();
	if (p < 0) {
		close(pfd[0]);
		close(pfd[1]);
		return errmsg(err, errlen, -errno, "fork: %s", strerror(errno));
	}
	if (p == 0) {
		fn(arg, pfd[1]);
		_exit(127); /* fn execs or exits; never returns here */
	}
	close(pfd[1]);
	/* EOF: the pipe closed on exec. Otherwise the child's errno before it. */
	do
		n = read(pfd[0], &e, sizeof(e));
	while (n < 0 && errno == EINTR);
	close(pfd[0]);
	if (n == (ssize_t)sizeof(e)) {
		waitpid(p, NULL, 0);
		*child_errno = e ? e : EIO;
		return -*child_errno;
	}
	*pid = p;
	return 0;
}

struct vmm_child {
	int dfd;
	char *const *argv;
	int ready_wr, lazy;
};

static void vmm_child(void *arg, int report)
{
	struct vmm_child *c = arg;

	child(c->dfd, c->argv, c->ready_wr, c->lazy, report);
}

int sbx_launch(int dfd, char *const argv[], int ready_wr, pid_t *pid, char *err, size_t errlen)
{
	return sbx_launch_lazy(dfd, argv, ready_wr, -1, pid, err, errlen);
}

int sbx_launch_lazy(int dfd, char *const argv[], int ready_wr, int lazy, pid_t *pid, char *err,
		    size_t errlen)
{
	struct vmm_child c = {dfd, argv, ready_wr, lazy};
	int e, r = sbx_spawn(vmm_child, &c, pid, &e, err, errlen);

	if (r && e == EWOULDBLOCK)
		return errmsg(err, errlen, -EWOULDBLOCK,
			      "another process is already running this sandbox");
	if (r && e) {
		char exe[4096];

		if (sbx_vmm_exe(exe, sizeof(exe)))
			snprintf(exe, sizeof(exe), "%s", SBX_VMM_EXE);
		return errmsg(err, errlen, -e, "cannot start the VMM %s: %s", exe, strerror(e));
	}
	return r;
}

pid_t sbx_vmm_pid(int dfd)
{
	return sbx_lock_pid(dfd, SBX_LOCK_VMM);
}

void sbx_vmm_log_tail(int dfd, char *out, size_t cap)
{
	sbx_log_tail(dfd, SBX_VMM_LOG, out, cap);
}

void sbx_log_tail(int dfd, const char *file, char *out, size_t cap)
{
	char buf[2048];
	struct stat st;
	size_t n;
	int fd = openat(dfd, file, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);

	out[0] = '\0';
	if (fd < 0)
		return;
	if (fstat(fd, &st) == 0 && st.st_size > 0) {
		n = st.st_size < (off_t)sizeof(buf) - 1 ? (size_t)st.st_size : sizeof(buf) - 1;
		if (pread_full(fd, buf, n, st.st_size - (off_t)n) == 0) {
			buf[n] = '\0';
			while (n && buf[n - 1] == '\n')
				buf[--n] = '\0';
			char *line = strrchr(buf, '\n');

			snprintf(out, cap, "%s", line ? line + 1 : buf);
		}
	}
	close(fd);
}
