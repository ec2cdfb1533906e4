/* agent.c: cove-init's guest agent process: vsock listener, a thread per host connection, reaper.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

#include "agent.h"
#include "common/accept_serve.h"
#include "cove-init.h"

/* {"op":"status"}: the epoch (never the token) and the exec sessions. */
static int status_handle(struct agent *ag, int fd)
{
	json_t *j;
	uint64_t epoch;
	int ret;

	pthread_mutex_lock(&ag->lock);
	epoch = ag->epoch;
	pthread_mutex_unlock(&ag->lock);
	j = json_pack("{s:b,s:I,s:o}", "ok", 1, "epoch", (json_int_t)epoch, "sessions",
		      exec_sessions_json(ag));
	if (!j)
		return -ENOMEM;
	ret = wire_msg_write(fd, j);
	json_decref(j);
	return ret;
}

/* {"op":"sync"}: the guest's page cache onto its disks (a template's build, before its final
 * snapshot), with no program of the image's own: a distroless image has no sync(1). */
static int sync_handle(int fd)
{
	sync();
	json_t *j = json_pack("{s:b}", "ok", 1);
	int ret = j ? wire_msg_write(fd, j) : -ENOMEM;
	json_decref(j);
	return ret;
}

/* Test mode: answer cove's "CONNECT <port>" line as cove's vsock device would. */
static int test_handshake(int fd)
{
	char line[32];
	size_t n = 0;

	while (n < sizeof(line) - 1) {
		if (wire_read_full(fd, line + n, 1) < 0)
			return -EPIPE;
		if (line[n++] == '\n')
			break;
	}
	line[n] = '\0';
	if (strncmp(line, "CONNECT ", 8) != 0 || atoi(line + 8) != AGENT_PORT)
		return -EINVAL;
	return wire_write_full(fd, "OK 1024\n", 8);
}

/* The agent runs commands as root: a guest process reaching it (vsock loopback) would own the
 * sandbox and the operator's sessions. Only the host may talk to it. */
static bool peer_allowed(struct agent *ag, int fd)
{
	struct sockaddr_storage peer;
	socklen_t plen = sizeof(peer);

	if (getpeername(fd, (struct sockaddr *)&peer, &plen) < 0)
		return false;
	if (wire_peer_allowed((struct sockaddr *)&peer, plen, ag->test_uds != NULL))
		return true;
	if (peer.ss_family == AF_VSOCK)
		init_err(ag->log,
			 "agent: refused a connection from vsock CID %u: only the host (CID 2) may "
			 "connect",
			 ((struct sockaddr_vm *)&peer)->svm_cid);
	else
		init_err(ag->log, "agent: refused a connection from address family %u",
			 peer.ss_family);
	return false;
}

/* First message on a connection names the operation; the rest of the connection is its own. */
static void conn_serve(void *ctx, int fd)
{
	struct agent *ag = ctx;
	char err[256];
	json_t *msg = NULL;
	const char *op;
	int ret;

	if (!peer_allowed(ag, fd))
		goto out;
	ret = ag->test_uds ? test_handshake(fd) : 0;
	if (ret == 0)
		ret = wire_msg_read(fd, &msg, err, sizeof(err));
	if (ret < 0) {
		if (ret == -EINVAL || ret == -EMSGSIZE)
			wire_reply_error(fd, "%s", err);
		goto out;
	}
	op = json_string_value(json_object_get(msg, "op"));
	if (!op)
		wire_reply_error(fd, "bad message: no \"op\"");
	else if (strcmp(op, "exec") == 0)
		exec_handle(ag, fd, msg);
	else if (strcmp(op, "attach") == 0)
		attach_handle(ag, fd, msg);
	else if (strcmp(op, "put") == 0)
		files_put(fd, msg);
	else if (strcmp(op, "get") == 0)
		files_get(fd, msg);
	else if (strcmp(op, "forward") == 0)
		forward_handle(fd, msg);
	else if (strcmp(op, "identity") == 0)
		identity_handle(ag, fd, msg);
	else if (strcmp(op, "status") == 0)
		status_handle(ag, fd);
	else if (strcmp(op, "sync") == 0)
		sync_handle(fd);
	else if (strcmp(op, "mount") == 0)
		mount_handle(fd, msg);
	else if (strcmp(op, "hostname") == 0)
		hostname_handle(ag, fd, msg);
	else
		wire_reply_error(fd, "unknown op \"%.64s\"", op);
out:
	json_decref(msg);
	close(fd);
}

/*
 * Reaps every child of the agent (it is a subreaper, so orphans of exec'd commands too). With no
 * child it sleeps until a spawn, with no timer: an idle guest should not wake for nothing. Every
 * fork is counted under the lock, so a spawn between `seen` and the ECHILD is never missed (an
 * orphan reparented to us needs a living or zombie child of ours, so waitpid waits for it).
 */
static void *reaper_thread(void *arg)
{
	struct agent *ag = arg;

	for (;;) {
		int wstatus;

		pthread_mutex_lock(&ag->lock);
		uint64_t seen = ag->spawns;
		pthread_mutex_unlock(&ag->lock);

		pid_t pid = waitpid(-1, &wstatus, 0);

		if (pid > 0) {
			exec_child_exited(ag, pid, wstatus);
			continue;
		}
		if (errno == EINTR)
			continue;
		pthread_mutex_lock(&ag->lock);
		while (ag->spawns == seen)
			pthread_cond_wait(&ag->child_cond, &ag->lock);
		pthread_mutex_unlock(&ag->lock);
	}
	return NULL;
}

static int spawn_detached(void *(*fn)(void *), void *arg)
{
	pthread_attr_t attr;
	pthread_t th;
	int ret;

	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 256 * 1024);
	ret = pthread_create(&th, &attr, fn, arg);
	pthread_attr_destroy(&attr);
	return -ret;
}

static int vsock_listen(unsigned port)
{
	struct sockaddr_vm addr = {
	    .svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_ANY, .svm_port = port};
	int fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 || listen(fd, 64) < 0) {
		int e = errno;

		close(fd);
		return -e;
	}
	return fd;
}

static int unix_listen(const char *path)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	if (strlen(path) >= sizeof(sun.sun_path)) {
		close(fd);
		return -ENAMETOOLONG;
	}
	strcpy(sun.sun_path, path);
	unlink(path);
	if (bind(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0 || listen(fd, 64) < 0) {
		int e = errno;

		close(fd);
		return -e;
	}
	return fd;
}

/* The agent process: never returns unless it cannot listen at all. */
int agent_run(const char *test_uds, struct logger *log)
{
	static struct agent ag; /* lives for the process; static only to stay off the stack */
	sigset_t all;
	int lfd, ret;

	sigemptyset(&all);
	sigprocmask(SIG_SETMASK, &all, NULL);
	signal(SIGPIPE, SIG_IGN);
	signal(SIGCHLD, SIG_DFL);
	prctl(PR_SET_NAME, "cove-agent");
	/* Orphans of exec'd commands come to us, so the reaper sees them, not PID 1. */
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	setsid();
	pthread_mutex_init(&ag.lock, NULL);
	pthread_cond_init(&ag.child_cond, NULL);
	ag.next_id = 1;
	ag.test_uds = test_uds;
	ag.log = log;

	lfd = test_uds ? unix_listen(test_uds) : vsock_listen(AGENT_PORT);
	if (lfd < 0) {
		init_err(log, "agent: listen on %s: %s", test_uds ? test_uds : "vsock port 1024",
			 strerror(-lfd));
		return 1;
	}
	ret = spawn_detached(reaper_thread, &ag);
	if (ret < 0) {
		init_err(log, "agent: thread: %s", strerror(-ret));
		return 1;
	}
	ret = broker_proxy_start(&ag);
	if (ret < 0)
		init_err(log, "agent: broker socket: %s (cove-fetch will not work)",
			 strerror(-ret));
	/* The egress proxy: in test mode on a free port, so parallel tests never collide. */
	ag.egress.test_uds = test_uds;
	ag.egress.port = test_uds ? 0 : EGRESS_LISTEN_PORT;
	ag.egress.log = log;
	ret = egress_proxy_start(&ag.egress);
	if (ret < 0)
		init_err(log, "agent: egress proxy on 127.0.0.1:%u: %s (no HTTP(S) egress)",
			 ag.egress.port, strerror(-ret));
	else if (test_uds)
		init_info(log, "agent: egress proxy on 127.0.0.1:%u", ag.egress.port);
	accept_serve(lfd, conn_serve, &ag);
}

/* The kernel creates lo down; up, it gets 127.0.0.1/8 (forwarded ports and local services). */
static void loopback_up(struct logger *log)
{
	struct ifreq ifr;
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return; /* a kernel without INET: nothing to forward to */
	memset(&ifr, 0, sizeof(ifr));
	strcpy(ifr.ifr_name, "lo");
	if (ioctl(fd, SIOCGIFFLAGS, &ifr) == 0 && !(ifr.ifr_flags & IFF_UP)) {
		ifr.ifr_flags |= IFF_UP;
		if (ioctl(fd, SIOCSIFFLAGS, &ifr) < 0)
			init_err(log, "lo up: %s", strerror(errno));
	}
	close(fd);
}

/* Called by PID 1 before it runs the command: the agent is a child process, not PID 1's threads,
 * so PID 1's own reaping (waitpid(-1)) and the agent's sessions never see each other's children. */
pid_t agent_start(struct logger *log)
{
	pid_t pid;

	loopback_up(log);
	pid = fork();
	if (pid < 0) {
		init_err(log, "agent: fork: %s", strerror(errno));
		return -1;
	}
	if (pid == 0)
		_exit(agent_run(NULL, log));
	return pid;
}
