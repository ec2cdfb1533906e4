/* cove-broker beside a named sandbox: found, started detached under a lock of its own, granted,
 * ended. */
#include "lifecycle/broker.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "common/unix_sock.h"
#include "common/file_io.h"
#include "lifecycle/launch.h"
#include "lifecycle/lock.h"
#include "proto/agent_wire.h"

/* How long a new broker gets to answer on its control socket, and to exit after SIGTERM. */
#define BROKER_START_WAIT_S  15
#define BROKER_STOP_WAIT_S   5
#define BROKER_CTL_TIMEOUT_S 10.0

static bool executable(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

int sbx_broker_find(char *out, size_t cap, char *err, size_t errlen)
{
	const char *env = getenv("COVE_BROKER"), *path = getenv("PATH");
	char self[PATH_MAX], *slash;
	ssize_t n;

	if (env && *env) {
		if (!executable(env))
			return errmsg(err, errlen, -ENOENT,
				      "COVE_BROKER=%s is not an executable file", env);
		return snprintf(out, cap, "%s", env) >= (int)cap ? -ENAMETOOLONG : 0;
	}
	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n > 0) {
		self[n] = '\0';
		slash = strrchr(self, '/');
		if (slash) {
			*slash = '\0';
			/* The build tree (build/cli/cove, build/broker/cove-broker), then
			 * installed. */
			if (snprintf(out, cap, "%s/../broker/cove-broker", self) < (int)cap &&
			    executable(out))
				return 0;
			if (snprintf(out, cap, "%s/cove-broker", self) < (int)cap &&
			    executable(out))
				return 0;
		}
	}
	for (const char *p = path; p && *p;) {
		size_t len = strcspn(p, ":");

		if (len && snprintf(out, cap, "%.*s/cove-broker", (int)len, p) < (int)cap &&
		    out[0] == '/' && executable(out))
			return 0;
		p += len + (p[len] == ':');
	}
	return errmsg(
	    err, errlen, -ENOENT,
	    "cove-broker not found (set COVE_BROKER, or install it beside cove or in PATH)");
}

int sbx_broker_check_policy(const char *exe, const char *file, char *err, size_t errlen)
{
	char *argv[] = {(char *)exe, "check-policy", (char *)file, NULL};
	char buf[1024], *line;
	size_t got = 0;
	ssize_t n;
	int pfd[2], st;
	pid_t p;

	if (pipe2(pfd, O_CLOEXEC) < 0)
		return errmsg(err, errlen, -errno, "pipe: %s", strerror(errno));
	p = fork();
	if (p < 0) {
		close(pfd[0]);
		close(pfd[1]);
		return errmsg(err, errlen, -errno, "fork: %s", strerror(errno));
	}
	if (p == 0) {
		int nul = open("/dev/null", O_RDWR | O_CLOEXEC);

		if (nul < 0 || dup2(nul, 0) < 0 || dup2(nul, 1) < 0 || dup2(pfd[1], 2) < 0)
			_exit(127);
		execv(exe, argv);
		dprintf(2, "cannot run %s: %s\n", exe, strerror(errno));
		_exit(127);
	}
	close(pfd[1]);
	while (got < sizeof(buf) - 1 && ((n = read(pfd[0], buf + got, sizeof(buf) - 1 - got)) > 0 ||
					 (n < 0 && errno == EINTR)))
		got += n > 0 ? (size_t)n : 0;
	close(pfd[0]);
	buf[got] = '\0';
	while (waitpid(p, &st, 0) < 0 && errno == EINTR)
		;
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return 0;
	while (got && buf[got - 1] == '\n')
		buf[--got] = '\0';
	line = strrchr(buf, '\n');
	line = line ? line + 1 : buf;
	if (!strncmp(line, "cove-broker: ", 13))
		line += 13;
	return errmsg(err, errlen, -EINVAL, "%s", line[0] ? line : "refused by cove-broker");
}

/* Closes every fd from 3 up but a and b. */
static void close_others(int a, int b)
{
	int lo = a < b ? a : b, hi = a < b ? b : a;

	if (lo > 3)
		close_range(3, (unsigned)lo - 1, 0);
	if (hi > lo + 1)
		close_range((unsigned)lo + 1, (unsigned)hi - 1, 0);
	close_range((unsigned)hi + 1, ~0U, 0);
}

/*
 * The supervisor (a child of the starting cove): a session of its own, broker.lock held by an
 * fd the broker does not inherit (its credential helpers must not keep the lock after it), the
 * broker forked and exec'd with a parent-death signal, waited for. The lock thus lives exactly
 * as long as the broker; killing the supervisor ends the broker too. Errors go up `report`.
 */
static void supervise(int rfd, int dfd, const char *exe, char *const argv[], int report)
{
	sigset_t none;
	int lk, nul, log, e;
	pid_t self, b;

	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	signal(SIGPIPE, SIG_DFL);
	setsid();
	lk = sbx_lock_take_rw(rfd, SBX_BROKER_LOCK);
	if (lk < 0) {
		e = -lk;
		goto fail;
	}
	nul = open("/dev/null", O_RDWR | O_CLOEXEC);
	log = openat(dfd, SBX_BROKER_LOG, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC,
		     0600);
	if (nul < 0 || log < 0 || dup2(nul, 0) < 0 || dup2(nul, 1) < 0 || dup2(log, 2) < 0) {
		e = errno;
		goto fail;
	}
	/* Nothing of the starting command stays open here (its start lock above all). */
	close_others(lk, report);
	self = getpid();
	b = fork();
	if (b < 0) {
		e = errno;
		goto fail;
	}
	if (b == 0) {
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() != self)
			_exit(127);
		execv(exe, argv);
		e = errno;
		goto fail;
	}
	if (ftruncate(lk, 0) < 0 || dprintf(lk, "%d\n", (int)b) < 0) {
		e = errno;
		kill(b, SIGKILL);
		goto fail;
	}
	close(report);
	while (waitpid(b, NULL, 0) < 0 && errno == EINTR)
		;
	_exit(0);
fail:
	if (write(report, &e, sizeof(e)) < 0)
		_exit(127);
	_exit(127);
}

static int run_dir_open(const struct sbx_root *r, const char *name)
{
	char path[PATH_MAX];
	int fd;

	if (sbx_run_path(r, name, NULL, path, sizeof(path)))
		return -ENAMETOOLONG;
	fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

/* The last epoch granted to this sandbox (0: none yet). */
static uint64_t epoch_read(int dfd)
{
	char buf[32] = "";
	int fd = dirfd_open(dfd, SBX_BROKER_EPOCH, O_RDONLY | O_CLOEXEC);
	ssize_t n;
	char *end;
	unsigned long long v;

	if (fd < 0)
		return 0;
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	errno = 0;
	v = strtoull(buf, &end, 10);
	return errno || end == buf || (*end && *end != '\n') || v > INT64_MAX / 2 ? 0 : v;
}

static void epoch_write(int dfd, uint64_t epoch)
{
	char buf[32];
	int n = snprintf(buf, sizeof(buf), "%llu\n", (unsigned long long)epoch);
	int fd = dirfd_create(dfd, ".broker.epoch.tmp", O_WRONLY | O_CLOEXEC, 0600);

	if (fd < 0)
		return;
	if (pwrite_full(fd, buf, (size_t)n, 0) == 0) {
		close(fd);
		dirfd_rename(dfd, ".broker.epoch.tmp", SBX_BROKER_EPOCH);
		return;
	}
	close(fd);
	dirfd_unlink(dfd, ".broker.epoch.tmp");
}

struct sup_args {
	int rfd, dfd;
	const char *exe;
	char *const *argv;
};

static void sup_child(void *arg, int report)
{
	struct sup_args *a = arg;

	supervise(a->rfd, a->dfd, a->exe, a->argv, report);
}

/* Forks the supervisor; 0 once the broker was exec'd (*sup set), or -errno with err. */
static int launch(int rfd, int dfd, const char *exe, char *const argv[], pid_t *sup, char *err,
		  size_t errlen)
{
	struct sup_args a = {rfd, dfd, exe, argv};
	int e, r = sbx_spawn(sup_child, &a, sup, &e, err, errlen);

	if (r && e == EWOULDBLOCK) /* another start won the lock: that broker is the one */
		return -EALREADY;
	if (r && e)
		return errmsg(err, errlen, -e, "cannot start cove-broker: %s", strerror(e));
	return r;
}

int sbx_broker_up(const struct sbx_root *r, const char *name, int dfd, const char *policy,
		  char *err, size_t errlen)
{
	char exe[PATH_MAX], listen[PATH_MAX], ctl[PATH_MAX], audit[PATH_MAX], epoch[24], tail[300];
	char state_dir[PATH_MAX], run_dir[PATH_MAX], egress[PATH_MAX], ca_dir[PATH_MAX];
	char *argv[24];
	int rfd, ret, n = 0;
	pid_t sup = -1;
	double deadline;

	rfd = run_dir_open(r, name);
	if (rfd < 0)
		return errmsg(err, errlen, rfd, "%s/%s: %s", r->run, name, strerror(-rfd));
	ret = sbx_lock_held(rfd, SBX_BROKER_LOCK);
	if (ret != 0) {
		close(rfd);
		return ret > 0 ? 0 : errmsg(err, errlen, ret, "broker lock: %s", strerror(-ret));
	}
	ret = sbx_broker_find(exe, sizeof(exe), err, errlen);
	if (ret)
		goto out;
	/* Guest ports 1025 (credential requests) and 1026 (the HTTP proxy's egress): cove
	 * connects a guest's vsock connection to host port P to <vsock uds>_P. */
	if (sbx_run_path(r, name, "vsock.sock_1025", listen, sizeof(listen)) ||
	    sbx_run_path(r, name, "vsock.sock_1026", egress, sizeof(egress)) ||
	    sbx_run_path(r, name, NULL, run_dir, sizeof(run_dir)) ||
	    sbx_run_path(r, name, SBX_BROKER_CTL, ctl, sizeof(ctl)) ||
	    snprintf(state_dir, sizeof(state_dir), "%s/%s", r->state, name) >=
		(int)sizeof(state_dir) ||
	    snprintf(audit, sizeof(audit), "%s/%s", state_dir, SBX_BROKER_AUDIT) >=
		(int)sizeof(audit) ||
	    snprintf(ca_dir, sizeof(ca_dir), "%s/%s", state_dir, SBX_BROKER_MITM_CA) >=
		(int)sizeof(ca_dir)) {
		ret = errmsg(err, errlen, -ENAMETOOLONG, "broker paths too long");
		goto out;
	}
	/*
	 * Epochs only go up, across brokers too: from the last one cove granted, or the wall clock
	 * in ms if that is later (a broker that died, or grants cove did not make, left no record;
	 * a broker makes far fewer than one grant per ms of its life).
	 */
	uint64_t last = epoch_read(dfd), now = (uint64_t)realtime_ms();
	snprintf(epoch, sizeof(epoch), "%llu", (unsigned long long)(last > now ? last : now));
	argv[n++] = exe;
	argv[n++] = "--policy";
	argv[n++] = (char *)policy;
	argv[n++] = "--listen";
	argv[n++] = listen;
	argv[n++] = "--ctl";
	argv[n++] = ctl;
	argv[n++] = "--audit";
	argv[n++] = audit;
	argv[n++] = "--initial-epoch";
	argv[n++] = epoch;
	argv[n++] = "--egress-listen";
	argv[n++] = egress;
	argv[n++] = "--mitm-ca-dir";
	argv[n++] = ca_dir;
	/* Its jail profile: the VMM's files (chain, disks, console, sockets) out of its sight. */
	argv[n++] = "--confine";
	argv[n++] = state_dir;
	argv[n++] = "--confine";
	argv[n++] = run_dir;
	argv[n] = NULL;
	/* The control socket in a directory of its own, which the VMM's jail shows empty. */
	if (mkdirat(rfd, SBX_BROKER_CTL_DIR, 0700) && errno != EEXIST) {
		ret = errmsg(err, errlen, -errno, "%s/%s: %s", run_dir, SBX_BROKER_CTL_DIR,
			     strerror(errno));
		goto out;
	}
	/* The CA's directory exists before any VMM starts, so its jail hides it (vmm_args.c). */
	if (mkdirat(dfd, SBX_BROKER_MITM_CA, 0700) && errno != EEXIST) {
		ret = errmsg(err, errlen, -errno, "%s: %s", ca_dir, strerror(errno));
		goto out;
	}
	ret = launch(rfd, dfd, exe, argv, &sup, err, errlen);
	if (ret == -EALREADY) {
		ret = 0;
		goto out;
	}
	if (ret)
		goto out;
	/* Ready once its control socket answers; a broker that exits first says why in its log. */
	deadline = mono_s() + BROKER_START_WAIT_S;
	for (;;) {
		json_t *req = json_pack("{s:s}", "op", "status"), *reply = NULL;

		ret = sbx_broker_ctl_call(ctl, req, 2.0, &reply, NULL, 0);
		json_decref(req);
		json_decref(reply);
		if (ret == 0)
			break;
		if (waitpid(sup, NULL, WNOHANG) == sup) {
			sbx_log_tail(dfd, SBX_BROKER_LOG, tail, sizeof(tail));
			ret = errmsg(err, errlen, -ECHILD, "cove-broker exited at start%s%s",
				     tail[0] ? ": " : "", tail);
			break;
		}
		if (mono_s() > deadline) {
			kill(sup, SIGKILL); /* its parent-death signal ends the broker */
			waitpid(sup, NULL, 0);
			ret = errmsg(err, errlen, -ETIMEDOUT,
				     "cove-broker did not answer on %s within %d s", ctl,
				     BROKER_START_WAIT_S);
			break;
		}
		usleep(50 * 1000);
	}
out:
	close(rfd);
	return ret;
}

int sbx_broker_ctl_call(const char *ctl, json_t *req, double timeout_s, json_t **reply, char *err,
			size_t errlen)
{
	int fd = unix_connect(ctl, 0, timeout_s), ret;

	*reply = NULL;
	if (fd == -ENAMETOOLONG)
		return errmsg(err, errlen, fd, "%s: path too long", ctl);
	if (fd < 0)
		return errmsg(err, errlen, fd, "broker control socket %s: %s", ctl, strerror(-fd));
	ret = wire_msg_write(fd, req);
	if (ret) {
		errmsg(err, errlen, ret, "broker control socket: %s", strerror(-ret));
		goto out;
	}
	ret = wire_msg_read(fd, reply, err, errlen);
out:
	close(fd);
	return ret;
}

int sbx_broker_grant_parse(json_t *reply, struct sbx_grant *g, char *err, size_t errlen)
{
	json_t *ep = json_object_get(reply, "epoch");
	const char *tok = json_string_value(json_object_get(reply, "token"));
	const char *why = json_string_value(json_object_get(reply, "error"));

	if (!json_is_true(json_object_get(reply, "ok")))
		return errmsg(err, errlen, -EPROTO, "broker refused the grant: %.200s",
			      why ? why : "no reason given");
	if (!json_is_integer(ep) || json_integer_value(ep) < 0 || !tok ||
	    strlen(tok) != SBX_TOKEN_HEX || strspn(tok, "0123456789abcdef") != SBX_TOKEN_HEX)
		return errmsg(err, errlen, -EPROTO, "broker's grant reply is malformed");
	g->epoch = (uint64_t)json_integer_value(ep);
	memcpy(g->token, tok, SBX_TOKEN_HEX + 1);
	return 0;
}

int sbx_broker_grant(const struct sbx_root *r, const char *name, int dfd, struct sbx_grant *g,
		     char *err, size_t errlen)
{
	char ctl[PATH_MAX];
	json_t *req, *reply = NULL;
	int ret;

	if (sbx_run_path(r, name, SBX_BROKER_CTL, ctl, sizeof(ctl)))
		return errmsg(err, errlen, -ENAMETOOLONG, "broker control path too long");
	req = json_pack("{s:s}", "op", "grant");
	if (!req)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	ret = sbx_broker_ctl_call(ctl, req, BROKER_CTL_TIMEOUT_S, &reply, err, errlen);
	json_decref(req);
	if (!ret)
		ret = sbx_broker_grant_parse(reply, g, err, errlen);
	json_decref(reply);
	if (!ret)
		epoch_write(dfd, g->epoch);
	return ret;
}

int sbx_broker_running(const struct sbx_root *r, const char *name)
{
	int rfd = run_dir_open(r, name), held;

	if (rfd < 0)
		return rfd == -ENOENT ? 0 : rfd;
	held = sbx_lock_held(rfd, SBX_BROKER_LOCK);
	close(rfd);
	return held;
}

int sbx_broker_end(const struct sbx_root *r, const char *name)
{
	int rfd = run_dir_open(r, name), ret = 0;
	pid_t pid;

	if (rfd < 0)
		return rfd == -ENOENT ? 0 : rfd;
	pid = sbx_lock_pid(rfd, SBX_BROKER_LOCK);
	if (pid <= 0) {
		close(rfd);
		return pid;
	}
	/* The supervisor holds the lock until it has reaped the broker, so pid is still ours. */
	for (int tick = 0;; tick++) {
		if (tick == 0 && kill(pid, SIGTERM) < 0 && errno != ESRCH) {
			ret = -errno;
			break;
		}
		if (tick == BROKER_STOP_WAIT_S * 20)
			kill(pid, SIGKILL);
		if (sbx_lock_held(rfd, SBX_BROKER_LOCK) == 0)
			break;
		if (tick > BROKER_STOP_WAIT_S * 40) {
			ret = -ETIMEDOUT;
			break;
		}
		usleep(50 * 1000);
	}
	close(rfd);
	return ret;
}
