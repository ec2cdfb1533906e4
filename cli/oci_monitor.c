/* The process a container's pid file names (cli/oci.h). */
#include "cli/oci.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/dirfd_io.h"
#include "common/file_io.h"

/* What `cove exec` passes on into the guest (its --help), and so what the monitor forwards. */
static const int forwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGWINCH};

/* NAME := "VALUE[ START]\n" (START: a process's start time, the pid-reuse guard). */
static void record(int dfd, const char *name, int value, unsigned long long start)
{
	char buf[64];
	if (dfd < 0)
		return;
	int n = start ? snprintf(buf, sizeof(buf), "%d %llu\n", value, start)
		      : snprintf(buf, sizeof(buf), "%d\n", value);
	int fd = dirfd_create(dfd, name, O_WRONLY | O_CLOEXEC, 0600);
	if (fd >= 0) {
		pwrite_full(fd, buf, (size_t)n, 0);
		close(fd);
	}
}

/* A holder's wait (a pod's "pause" has no VM): INT, TERM, HUP or QUIT end it with status 0, as
 * the pause program exits; others are ignored. */
static int hold(int sfd)
{
	for (;;) {
		struct signalfd_siginfo si;
		if (read(sfd, &si, sizeof(si)) != (ssize_t)sizeof(si)) {
			if (errno == EINTR)
				continue;
			return 1;
		}
		if (si.ssi_signo == SIGINT || si.ssi_signo == SIGTERM || si.ssi_signo == SIGHUP ||
		    si.ssi_signo == SIGQUIT)
			return 0;
	}
}

void oci_monitor(struct oci_ctx *x, int dfd, int fifo_fd, const struct oci_monitor_how *how,
		 const struct oci_process *p)
{
	const char *sandbox = how->sandbox;
	bool end_vm = how->end_vm;
	sigset_t mask;
	char cove[4200], user[32];
	int code = 1;

	sigemptyset(&mask);
	for (size_t i = 0; i < sizeof(forwarded) / sizeof(*forwarded); i++)
		sigaddset(&mask, forwarded[i]);
	sigaddset(&mask, SIGCHLD);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	int sfd = signalfd(-1, &mask, SFD_CLOEXEC);
	/* Until `start`: a byte on the fifo. A signal first ends the container unstarted. */
	if (fifo_fd >= 0) {
		struct pollfd pf[2] = {{.fd = fifo_fd, .events = POLLIN},
				       {.fd = sfd, .events = POLLIN}};
		for (;;) {
			if (poll(pf, 2, -1) < 0 && errno != EINTR)
				break;
			char b;
			/* The monitor holds the fifo open for writing too: it never reads EOF. */
			if (pf[0].revents && read(fifo_fd, &b, 1) == 1)
				break;
			struct signalfd_siginfo si;
			if (pf[1].revents && read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si) &&
			    si.ssi_signo != SIGCHLD && si.ssi_signo != SIGWINCH) {
				code = 128 + (int)si.ssi_signo;
				goto done;
			}
		}
		close(fifo_fd);
	}
	if (!sandbox) { /* a pod's sandbox container: it holds until a signal ends it */
		code = hold(sfd);
		goto done;
	}
	char **argv = NULL;
	if (oci_cove_path(cove, sizeof(cove)) == 0 && how->attach) {
		argv = calloc(5, sizeof(*argv));
		if (argv) {
			argv[0] = cove;
			argv[1] = "attach";
			argv[2] = (char *)sandbox;
			argv[3] = (char *)how->attach;
		}
	} else if (oci_cove_path(cove, sizeof(cove)) == 0) {
		argv = oci_exec_argv(cove, sandbox, p, user, sizeof(user), how->session_file);
	}
	pid_t child = argv ? fork() : -1;
	if (child == 0) {
		sigprocmask(SIG_UNBLOCK, &mask, NULL);
		execv(cove, argv);
		dprintf(2, "cove-oci: cannot run %s: %s\n", cove, strerror(errno));
		_exit(127);
	}
	free(argv);
	if (child < 0) {
		log_err(x->log, "%s: cannot start the container process", sandbox);
		goto done;
	}
	record(dfd, OCI_EXEC_PID, (int)child, (unsigned long long)oci_proc_start(child));
	for (;;) {
		struct signalfd_siginfo si;
		if (read(sfd, &si, sizeof(si)) != (ssize_t)sizeof(si)) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (si.ssi_signo != SIGCHLD) {
			kill(child, (int)si.ssi_signo);
			continue;
		}
		int st;
		pid_t w = waitpid(child, &st, WNOHANG);
		if (w == child) {
			code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
			break;
		}
	}
done:
	record(dfd, OCI_EXIT, code, 0);
	if (end_vm && sandbox && oci_sandbox_rm(x, sandbox) != 0)
		log_warn(x->log, "%s: cove rm: %s", sandbox, x->err);
	_exit(code);
}
