/* The spawner process: starts `cove restore` clones for a VMM that may not fork or exec. */
#include "sandbox/spawner.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define SPAWNER_ARGS_MAX 128
#define SPAWNER_SOCK_FD	 3 /* in the spawner: its end of the socket */
#define SPAWNER_EXE_FD	 4 /* in the spawner: the cove binary */

struct spawn_reply {
	int32_t r; /* 0 or -errno */
	int32_t pid;
};

/* One message with at most one fd attached (close-on-exec on arrival). */
static ssize_t recv_with_fd(int sock, void *buf, size_t len, int *fd)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = {buf, len};
	struct msghdr mh = {
	    .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
	*fd = -1;
	ssize_t n;
	do
		n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
		    c->cmsg_len == CMSG_LEN(sizeof(int)) && *fd < 0)
			memcpy(fd, CMSG_DATA(c), sizeof(int));
	if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
		if (*fd >= 0)
			close(*fd);
		*fd = -1;
		return -EMSGSIZE;
	}
	return n;
}

static int send_with_fd(int sock, const void *buf, size_t len, int fd)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	memset(cbuf, 0, sizeof(cbuf));
	struct iovec iov = {(void *)buf, len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (fd >= 0) {
		mh.msg_control = cbuf;
		mh.msg_controllen = sizeof(cbuf);
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	ssize_t n;
	do
		n = sendmsg(sock, &mh, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	return (size_t)n == len ? 0 : -EIO;
}

/*
 * What the spawner runs: `cove restore` only, never with --no-seccomp, and no key provider but
 * the one it was started with (a --key spec can name a command). Any option getopt_long could
 * read as --key (an abbreviation, --key=...) other than "--key" followed by exactly that spec is
 * refused.
 */
static int allowed(char *const argv[], int argc, const char *key, const struct spawner_disks *disks)
{
	int nr_disk = 0;
	if (argc < 2 || strcmp(argv[0], "cove") || strcmp(argv[1], "restore"))
		return -EPERM;
	for (int i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "--"))
			return -EPERM;
		/* Each disk exactly the parent's, in order ("--d": getopt's shortest for it). */
		if (!strncmp(argv[i], "--d", 3)) {
			if (strcmp(argv[i], "--disk") || i + 1 >= argc || !disks ||
			    nr_disk >= disks->nr || strcmp(argv[i + 1], disks->arg[nr_disk]))
				return -EPERM;
			nr_disk++;
			i++;
			continue;
		}
		/* A clone always runs under filters: no --no-seccomp (or a prefix getopt takes). */
		if (!strncmp(argv[i], "--n", 3))
			return -EPERM;
		/* The binary goes to a clone only as fd 4 ("--ex": getopt's shortest for it). */
		if (!strncmp(argv[i], "--ex", 4)) {
			if (strcmp(argv[i], "--exe-fd") || i + 1 >= argc ||
			    strcmp(argv[i + 1], "4"))
				return -EPERM;
			i++;
			continue;
		}
		if (strncmp(argv[i], "--k", 3))
			continue;
		if (strcmp(argv[i], "--key") || !key || i + 1 >= argc || strcmp(argv[i + 1], key))
			return -EPERM;
		i++;
	}
	return 0;
}

/*
 * The clone's side of the fork: stdin and stdout /dev/null (a clone's console is its own
 * file), the ready pipe as fd 3 and no other fd of ours, default SIGPIPE and SIGCHLD, an empty
 * mask, a session of its own (it outlives its parent and its terminal); then the binary at
 * SPAWNER_EXE_FD, which the clone keeps as fd 4 only when asked with --exe-fd 4 (a jail's).
 * Never returns.
 */
static void exec_clone(char *const argv[], int fd3)
{
	for (int i = 0; argv[i]; i++)
		if (!strcmp(argv[i], "--exe-fd"))
			fcntl(SPAWNER_EXE_FD, F_SETFD, 0); /* allowed() made it "--exe-fd 4" */
	sigset_t none;
	sigemptyset(&none);
	signal(SIGPIPE, SIG_DFL);
	signal(SIGCHLD, SIG_DFL);
	sigprocmask(SIG_SETMASK, &none, NULL);
	setsid();
	int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (nul < 0 || dup2(nul, STDIN_FILENO) < 0 || dup2(nul, STDOUT_FILENO) < 0)
		_exit(127);
	if (fd3 >= 0 && dup2(fd3, 3) < 0)
		_exit(127);
	syscall(SYS_close_range, SPAWNER_EXE_FD + 1, ~0U, 0);
	syscall(SYS_execveat, SPAWNER_EXE_FD, "", argv, environ, AT_EMPTY_PATH);
	_exit(127);
}

static int spawn_one(char *buf, size_t n, int fd3, const char *key,
		     const struct spawner_disks *disks, int *pid)
{
	char *argv[SPAWNER_ARGS_MAX + 1];
	int argc = 0;
	if (!n || buf[n - 1] != '\0')
		return -EINVAL;
	for (size_t at = 0; at < n; at += strlen(buf + at) + 1) {
		if (argc == SPAWNER_ARGS_MAX)
			return -E2BIG;
		argv[argc++] = buf + at;
	}
	argv[argc] = NULL;
	int r = allowed(argv, argc, key, disks);
	if (r)
		return r;
	/* Single-threaded: fork is safe; fds 3 (our socket) and 4 (the binary) close on exec. */
	pid_t p = fork();
	if (p < 0)
		return -errno;
	if (p == 0)
		exec_clone(argv, fd3);
	*pid = (int)p;
	return 0;
}

/* The spawner's life: one request at a time; clones reaped as they exit; EOF ends it. */
static void serve(int sock, const char *key, const struct spawner_disks *disks)
{
	prctl(PR_SET_NAME, "cove-spawner", 0, 0, 0);
	sigset_t chld;
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigprocmask(SIG_BLOCK, &chld, NULL);
	int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
	char *buf = malloc(SPAWNER_MSG_MAX);
	if (sfd < 0 || !buf)
		_exit(1);
	for (;;) {
		struct pollfd p[2] = {{.fd = sock, .events = POLLIN},
				      {.fd = sfd, .events = POLLIN}};
		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			_exit(1);
		}
		if (p[1].revents) {
			struct signalfd_siginfo si;
			while (read(sfd, &si, sizeof(si)) == sizeof(si))
				;
			while (waitpid(-1, NULL, WNOHANG) > 0)
				;
		}
		if (!p[0].revents)
			continue;
		int fd3;
		ssize_t n = recv_with_fd(sock, buf, SPAWNER_MSG_MAX, &fd3);
		if (n == 0 || (n < 0 && n != -EMSGSIZE))
			_exit(0); /* the VMM is gone */
		struct spawn_reply rep = {0, 0};
		int pidfd = -1, pid = 0;
		rep.r = n < 0 ? (int32_t)n : spawn_one(buf, (size_t)n, fd3, key, disks, &pid);
		if (!rep.r) {
			/* Before this loop reaps it, so the pid cannot name another process yet. */
			pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
			rep.pid = pid;
			if (pidfd < 0)
				rep.r = -errno;
		}
		if (fd3 >= 0)
			close(fd3);
		if (send_with_fd(sock, &rep, sizeof(rep), rep.r ? -1 : pidfd) < 0)
			_exit(0);
		if (pidfd >= 0)
			close(pidfd);
	}
}

int spawner_start(struct spawner *sp, const char *key, int exe_fd)
{
	return spawner_start_disks(sp, key, NULL, exe_fd);
}

int spawner_start_disks(struct spawner *sp, const char *key, const struct spawner_disks *disks,
			int exe_fd)
{
	sp->sock = -1;
	sp->pid = -1;
	/* Past the fds the spawner sets up, so none overwrites another. */
	int exe = exe_fd >= 0 ? fcntl(exe_fd, F_DUPFD_CLOEXEC, 10)
			      : open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
	if (exe >= 0 && exe < 10) {
		int hi = fcntl(exe, F_DUPFD_CLOEXEC, 10);
		close(exe);
		exe = hi;
	}
	if (exe < 0)
		return -errno;
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
		int e = errno;
		close(exe);
		return -e;
	}
	pid_t pid = fork();
	if (pid < 0) {
		int e = errno;
		close(sv[0]);
		close(sv[1]);
		close(exe);
		return -e;
	}
	if (pid == 0) {
		/* Nothing of the VMM but stdio, the socket and the binary: no KVM fd, no disk. */
		close(sv[0]);
		if ((sv[1] != SPAWNER_SOCK_FD && dup3(sv[1], SPAWNER_SOCK_FD, O_CLOEXEC) < 0) ||
		    dup3(exe, SPAWNER_EXE_FD, O_CLOEXEC) < 0)
			_exit(1);
		syscall(SYS_close_range, SPAWNER_EXE_FD + 1, ~0U, 0);
		serve(SPAWNER_SOCK_FD, key, disks); /* the child's copy of *disks */
		_exit(0);
	}
	close(sv[1]);
	close(exe);
	sp->sock = sv[0];
	sp->pid = (int)pid;
	return 0;
}

int spawner_spawn(struct spawner *sp, const char *const argv[], int fd3, int *pid, int *pidfd)
{
	if (sp->sock < 0)
		return -ENOTCONN;
	char *buf = malloc(SPAWNER_MSG_MAX);
	if (!buf)
		return -ENOMEM;
	size_t n = 0;
	for (int i = 0; argv[i]; i++) {
		size_t len = strlen(argv[i]) + 1;
		if (len > SPAWNER_MSG_MAX - n) {
			free(buf);
			return -E2BIG;
		}
		memcpy(buf + n, argv[i], len);
		n += len;
	}
	int r = send_with_fd(sp->sock, buf, n, fd3);
	free(buf);
	if (r)
		return r;
	struct spawn_reply rep;
	int fd;
	ssize_t got = recv_with_fd(sp->sock, &rep, sizeof(rep), &fd);
	if (got < 0)
		return (int)got;
	if (got != sizeof(rep) || (!rep.r && fd < 0) || rep.r > 0) {
		if (fd >= 0)
			close(fd);
		return -EPROTO;
	}
	if (rep.r) {
		if (fd >= 0)
			close(fd);
		return rep.r;
	}
	*pid = rep.pid;
	*pidfd = fd;
	return 0;
}

void spawner_stop(struct spawner *sp)
{
	if (sp->sock >= 0)
		close(sp->sock);
	sp->sock = -1;
	if (sp->pid > 0)
		while (waitpid(sp->pid, NULL, 0) < 0 && errno == EINTR)
			;
	sp->pid = -1;
}
