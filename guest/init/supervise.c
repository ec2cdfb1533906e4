/* supervise.c: runs the sandbox command on the console, reaps every child, handles stop requests.
 */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <grp.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "cove-init.h"

/* How long the command gets between SIGTERM and SIGKILL when the VM is asked to stop. */
#define STOP_GRACE_MS 3000
/* How long leftover processes get once the command has ended. */
#define CLEANUP_GRACE_MS   1000
#define AGENT_RESTARTS_MAX 5

static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int shell_status(int wstatus)
{
	if (WIFEXITED(wstatus))
		return WEXITSTATUS(wstatus);
	if (WIFSIGNALED(wstatus))
		return 128 + WTERMSIG(wstatus);
	return 255;
}

/*
 * Signals to PID 1 that have no handler are dropped by the kernel, but blocked ones stay
 * pending, so a signalfd sees them. SIGINT is what ctrl-alt-del sends once CAD is disabled.
 */
int sup_init(struct sup *s, struct logger *log)
{
	sigset_t mask;

	s->log = log;
	s->main_pid = -1;
	s->main_status = -1;
	s->agent_pid = -1;
	s->agent_restarts = 0;
	s->stopping = false;
	sigemptyset(&mask);
	sigaddset(&mask, SIGCHLD);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	/* busybox halt and poweroff ask init with SIGUSR1/SIGUSR2 (reboot uses SIGTERM). */
	sigaddset(&mask, SIGUSR1);
	sigaddset(&mask, SIGUSR2);
	if (sigprocmask(SIG_BLOCK, &mask, &s->old_mask) < 0)
		return -errno;
	s->sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	if (s->sigfd < 0)
		return -errno;
	return 0;
}

/*
 * In the child: own session.  Only an interactive shell gets the console as its
 * controlling tty (ctrl-C, job control): when a session leader with a
 * controlling tty exits, the kernel hangs the tty up and discards output still
 * queued for the UART, which lost the tail of a command's output whenever
 * another vCPU was still draining it.
 */
static void child_attach_console(bool controlling)
{
	int fd;

	if (setsid() < 0)
		return;
	if (!controlling)
		return; /* keep init's console descriptors */
	fd = open("/dev/console", O_RDWR);
	if (fd < 0)
		return;
	/* 1: take the tty even if an earlier session still holds it (we are root). */
	if (ioctl(fd, TIOCSCTTY, 1) < 0)
		dprintf(2, "cove-init: TIOCSCTTY: %s\n", strerror(errno));
	for (int i = 0; i < 3; i++)
		if (fd != i)
			dup2(fd, i);
	if (fd > 2)
		close(fd);
}

/* The command, or the image's main process as uid/gid (ids NULL: as cove-init) in cwd. */
static int spawn(struct sup *s, char *const argv[], char *const envp[], const char *cwd,
		 const uid_t *uid, const gid_t *gid, bool interactive)
{
	pid_t pid = fork();

	if (pid < 0)
		return -errno;
	if (pid == 0) {
		sigprocmask(SIG_SETMASK, &s->old_mask, NULL);
		child_attach_console(interactive);
		if (uid && (setgroups(0, NULL) < 0 || setgid(*gid) < 0 || setuid(*uid) < 0)) {
			dprintf(2, "cove-init: main process as %u:%u: %s\n", (unsigned)*uid,
				(unsigned)*gid, strerror(errno));
			_exit(126);
		}
		if (cwd && chdir(cwd) < 0) {
			dprintf(2, "cove-init: main process: cd %s: %s\n", cwd, strerror(errno));
			_exit(126);
		}
		if (envp)
			execvpe(argv[0], argv, envp);
		else
			execvp(argv[0], argv);
		dprintf(2, "cove-init: exec %s: %s\n", argv[0], strerror(errno));
		_exit(errno == ENOENT ? 127 : 126);
	}
	s->main_pid = pid;
	s->main_status = -1;
	return 0;
}

int sup_spawn(struct sup *s, char *const argv[], bool interactive)
{
	return spawn(s, argv, NULL, NULL, NULL, NULL, interactive);
}

int sup_spawn_as(struct sup *s, char *const argv[], char *const envp[], const char *cwd, uid_t uid,
		 gid_t gid)
{
	return spawn(s, argv, envp, cwd, &uid, &gid, false);
}

int sup_spawn_idle(struct sup *s)
{
	pid_t pid = fork();

	if (pid < 0)
		return -errno;
	if (pid == 0) {
		sigprocmask(SIG_SETMASK, &s->old_mask, NULL);
		setsid();
		for (;;)
			pause();
	}
	s->main_pid = pid;
	s->main_status = -1;
	return 0;
}

static bool stop_signal(int sig)
{
	return sig == SIGTERM || sig == SIGINT || sig == SIGUSR1 || sig == SIGUSR2;
}

/* The agent crashed or was killed: exec sessions are gone, but new ones should work. Only while
 * the command runs (sup_stop_all ends the agent on purpose), and only a few times. */
static void agent_died(struct sup *s, int wstatus)
{
	s->agent_pid = -1;
	if (s->main_status >= 0 || s->main_pid < 0)
		return;
	init_err(s->log, "agent ended (status %d)%s", shell_status(wstatus),
		 s->agent_restarts < AGENT_RESTARTS_MAX ? ", restarting it" : "");
	if (s->agent_restarts++ < AGENT_RESTARTS_MAX)
		s->agent_pid = agent_start(s->log);
}

/* Returns 1 while children remain, 0 once there are none. */
static int reap(struct sup *s)
{
	for (;;) {
		int wstatus;
		pid_t pid = waitpid(-1, &wstatus, WNOHANG);

		if (pid == 0)
			return 1;
		if (pid < 0)
			return errno == EINTR ? 1 : 0;
		if (pid == s->main_pid)
			s->main_status = shell_status(wstatus);
		if (pid == s->agent_pid)
			agent_died(s, wstatus);
	}
}

/* Waits for a signal for at most timeout_ms (-1: forever); returns its number, or 0. */
static int next_signal(struct sup *s, int timeout_ms)
{
	struct pollfd pfd = {.fd = s->sigfd, .events = POLLIN};
	struct signalfd_siginfo si;

	if (poll(&pfd, 1, timeout_ms) <= 0)
		return 0;
	if (read(s->sigfd, &si, sizeof(si)) != (ssize_t)sizeof(si))
		return 0;
	return (int)si.ssi_signo;
}

static void signal_main(struct sup *s, int sig)
{
	/* The command leads its own process group; signal the group, and it directly in case
	 * it has not reached setsid() yet. */
	kill(-s->main_pid, sig);
	kill(s->main_pid, sig);
}

/* Runs until the command ends; a stop request ends it (TERM, then KILL). Returns its status. */
int sup_wait(struct sup *s)
{
	long long deadline = -1;

	for (;;) {
		int timeout = -1, sig;

		reap(s);
		if (s->main_status >= 0)
			return s->main_status;
		if (deadline >= 0) {
			long long left = deadline - now_ms();

			if (left <= 0) {
				signal_main(s, SIGKILL);
				deadline = -1;
				continue;
			}
			timeout = (int)left;
		}
		sig = next_signal(s, timeout);
		if (!stop_signal(sig))
			continue;
		s->stopping = true;
		if (deadline < 0) {
			init_info(s->log, "stop requested (%s): terminating the command",
				  strsignal(sig));
			signal_main(s, SIGTERM);
			deadline = now_ms() + STOP_GRACE_MS;
		} else {
			signal_main(s, SIGKILL);
		}
	}
}

int sup_pause(struct sup *s, int ms)
{
	long long deadline = now_ms() + ms;

	for (;;) {
		long long left = deadline - now_ms();
		reap(s);
		if (left <= 0)
			return 0;
		if (stop_signal(next_signal(s, (int)left))) {
			s->stopping = true;
			return 1;
		}
	}
}

/* Ends whatever the command left behind (daemons, background jobs) so file systems are idle. */
void sup_stop_all(struct sup *s)
{
	long long deadline;

	if (!reap(s))
		return;
	kill(-1, SIGTERM);
	deadline = now_ms() + CLEANUP_GRACE_MS;
	while (reap(s)) {
		long long left = deadline - now_ms();

		if (left <= 0)
			break;
		next_signal(s, (int)left);
	}
	if (!reap(s))
		return;
	kill(-1, SIGKILL);
	/* Processes stuck in uninterruptible sleep may never go; do not wait for them forever. */
	deadline = now_ms() + CLEANUP_GRACE_MS;
	while (reap(s) && now_ms() < deadline)
		next_signal(s, 50);
}
