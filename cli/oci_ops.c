/* cove-oci state, kill, delete, exec, pause, resume and ps (cli/oci.h). */
#include "cli/oci.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "common/dirfd_io.h"
#include "lifecycle/tree.h"
#include "oci/signals.h"

/* ROOT/ID and its state: the dir's fd, or -1 after an error line. */
static int open_container(struct oci_ctx *x, const char *what, const char *id, struct oci_state *s)
{
	int dfd = oci_state_dir(x->root, id, false, x->err, sizeof(x->err));
	if (dfd < 0) {
		oci_fail(x, "%s: %s", what, x->err);
		return -1;
	}
	if (oci_state_read(dfd, s, x->err, sizeof(x->err))) {
		oci_fail(x, "%s %s: %s", what, id, x->err);
		close(dfd);
		return -1;
	}
	oci_state_env_apply(s);
	return dfd;
}

void oci_container_end(struct oci_ctx *x, int dfd, const struct oci_state *s)
{
	pid_t child = oci_exec_child(dfd);
	if (oci_monitor_alive(s))
		kill(s->pid, SIGKILL);
	if (child > 0)
		kill(child, SIGKILL);
	if (!s->holder && oci_sandbox_rm(x, s->sandbox) != 0)
		log_debug(x->log, "%s: cove rm: %s", s->sandbox, x->err);
}

int oci_cmd_state(struct oci_ctx *x, int argc, char **argv)
{
	struct oci_state s;
	if (argc != 2)
		return oci_fail(x, "state: want one container id");
	int dfd = open_container(x, "state", argv[1], &s);
	if (dfd < 0)
		return 1;
	json_t *j = oci_state_json(dfd, &s);
	char *text = j ? json_dumps(j, JSON_INDENT(2)) : NULL;
	json_decref(j);
	if (text)
		printf("%s\n", text);
	free(text);
	oci_state_free(&s);
	close(dfd);
	return text ? 0 : 1;
}

int oci_cmd_kill(struct oci_ctx *x, int argc, char **argv)
{
	bool all = false;
	int i = 1;
	for (; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "--all") || !strcmp(argv[i], "-a"))
			all = true;
		else
			return oci_fail(x, "kill: unknown option '%s'", argv[i]);
	}
	if (i != argc - 1 && i != argc - 2)
		return oci_fail(x, "kill: want a container id and a signal");
	int sig = i == argc - 2 ? oci_signal_parse(argv[i + 1]) : SIGTERM;
	if (sig < 0)
		return oci_fail(x, "kill: bad signal '%s'", argv[i + 1]);
	struct oci_state s;
	int dfd = open_container(x, "kill", argv[i], &s), st = 0;
	if (dfd < 0)
		return 1;
	const char *status = oci_status(dfd, &s);
	if (!strcmp(status, "stopped")) {
		/* containerd's shim sends kill --all KILL after the process is gone: done already
		 */
		if (!all)
			st = oci_fail(x, "kill %s: the container is not running", s.id);
	} else if (sig == SIGKILL) {
		oci_container_end(x, dfd, &s);
	} else if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT ||
		   sig == SIGUSR1 || sig == SIGUSR2 || sig == SIGWINCH) {
		if (kill(s.pid, sig) < 0)
			st = oci_fail(x, "kill %s: %s", s.id, strerror(errno));
	} else {
		st =
		    oci_fail(x,
			     "kill %s: signal %d does not reach a process in a cove VM (KILL, INT, "
			     "TERM, HUP, QUIT, USR1, USR2 and WINCH do)",
			     s.id, sig);
	}
	oci_state_free(&s);
	close(dfd);
	return st;
}

int oci_cmd_delete(struct oci_ctx *x, int argc, char **argv)
{
	bool force = false;
	int i = 1;
	for (; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "--force") || !strcmp(argv[i], "-f"))
			force = true;
		else
			return oci_fail(x, "delete: unknown option '%s'", argv[i]);
	}
	if (i != argc - 1)
		return oci_fail(x, "delete: want one container id");
	struct oci_state s;
	int dfd = oci_state_dir(x->root, argv[i], false, x->err, sizeof(x->err));
	/* As runc: --force on a container that is not there has nothing left to do. */
	if (dfd == -ENOENT && force)
		return 0;
	if (dfd < 0)
		return oci_fail(x, "delete: %s", x->err);
	bool have = oci_state_read(dfd, &s, x->err, sizeof(x->err)) == 0;
	if (have) {
		oci_state_env_apply(&s);
		const char *status = oci_status(dfd, &s);
		if (strcmp(status, "stopped") && !force) {
			oci_fail(x, "delete %s: the container is %s (--force ends it)", s.id,
				 status);
			oci_state_free(&s);
			close(dfd);
			return 1;
		}
		oci_container_end(x, dfd, &s);
		oci_state_free(&s);
	}
	close(dfd);
	int rfd = open(x->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int r = rfd < 0 ? -errno : sbx_tree_remove(rfd, argv[i]);
	if (rfd >= 0)
		close(rfd);
	return r ? oci_fail(x, "delete %s: %s", argv[i], strerror(-r)) : 0;
}

int oci_cmd_pause(struct oci_ctx *x, int argc, char **argv)
{
	bool pause = !strcmp(argv[0], "pause");
	struct oci_state s;
	if (argc != 2)
		return oci_fail(x, "%s: want one container id", argv[0]);
	int dfd = open_container(x, argv[0], argv[1], &s), st = 1;
	if (dfd < 0)
		return 1;
	const char *status = oci_status(dfd, &s);
	const char *cmd[] = {"cove", argv[0], s.sandbox, NULL};
	if (strcmp(status, pause ? "running" : "paused")) {
		oci_fail(x, "%s %s: the container is %s", argv[0], s.id, status);
	} else if (!s.holder && oci_cove(x, cmd) != 0) { /* a holder has no VM: state only */
		oci_fail(x, "%s %s: %s", argv[0], s.id, x->err);
	} else {
		if (pause) {
			int fd = dirfd_create(dfd, OCI_PAUSED, O_WRONLY | O_CLOEXEC, 0600);
			if (fd >= 0)
				close(fd);
		} else {
			unlinkat(dfd, OCI_PAUSED, 0);
		}
		st = 0;
	}
	oci_state_free(&s);
	close(dfd);
	return st;
}

int oci_cmd_ps(struct oci_ctx *x, int argc, char **argv)
{
	bool json = false;
	int i = 1;
	for (; i < argc && argv[i][0] == '-'; i++) {
		if (!strcmp(argv[i], "--format") && i + 1 < argc)
			json = !strcmp(argv[++i], "json");
		else if (!strncmp(argv[i], "--format=", 9))
			json = !strcmp(argv[i] + 9, "json");
		else
			return oci_fail(x, "ps: unknown option '%s'", argv[i]);
	}
	if (i != argc - 1)
		return oci_fail(x, "ps: want one container id");
	struct oci_state s;
	int dfd = open_container(x, "ps", argv[i], &s);
	if (dfd < 0)
		return 1;
	/* The host's processes of the container: its monitor and the cove exec it runs. */
	pid_t child = oci_exec_child(dfd);
	bool up = oci_monitor_alive(&s);
	if (json) {
		printf("[");
		if (up)
			printf("%d%s", (int)s.pid, child > 0 ? "," : "");
		if (child > 0)
			printf("%d", (int)child);
		printf("]\n");
	} else {
		printf("PID\n");
		if (up)
			printf("%d\n", (int)s.pid);
		if (child > 0)
			printf("%d\n", (int)child);
	}
	oci_state_free(&s);
	close(dfd);
	return 0;
}

int oci_cmd_exec(struct oci_ctx *x, int argc, char **argv)
{
	static const struct option opts[] = {
	    {"process", required_argument, NULL, 'p'},
	    {"pid-file", required_argument, NULL, 'f'},
	    {"console-socket", required_argument, NULL, 'c'},
	    {"detach", no_argument, NULL, 'd'},
	    {"tty", no_argument, NULL, 't'},
	    {NULL, 0, NULL, 0},
	};
	const char *process = NULL, *pid_file = NULL, *console = NULL;
	bool detach = false, tty_flag = false;
	int c;
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "dt", opts, NULL)) != -1) {
		if (c == 'p')
			process = optarg;
		else if (c == 'f')
			pid_file = optarg;
		else if (c == 'c')
			console = optarg;
		else if (c == 'd')
			detach = true;
		else if (c == 't')
			tty_flag = true;
		else
			return oci_fail(x, "exec: unknown option '%s'", argv[optind - 1]);
	}
	if (optind != argc - 1 || !process)
		return oci_fail(x, "exec: want --process FILE and one container id");
	struct oci_state s;
	struct oci_process p;
	int dfd = open_container(x, "exec", argv[optind], &s), st = 1, tty = -1;
	if (dfd < 0)
		return 1;
	if (oci_process_load(process, &p, x->err, sizeof(x->err))) {
		oci_fail(x, "exec %s: --process: %s", s.id, x->err);
		goto out;
	}
	p.terminal = p.terminal || tty_flag;
	if (s.holder) {
		oci_fail(x, "exec %s: a pod's sandbox container has no VM to run a process in",
			 s.id);
		goto out_p;
	}
	const char *status = oci_status(dfd, &s);
	if (strcmp(status, "running")) {
		oci_fail(x, "exec %s: the container is %s", s.id, status);
		goto out_p;
	}
	if (p.terminal && (tty = oci_console(x, console)) < 0) {
		oci_fail(x, "exec %s: %s", s.id, x->err);
		goto out_p;
	}
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		oci_console_take(tty);
		/* No record: an exec's status is its monitor's wait status. */
		oci_monitor(x, -1, -1, &(struct oci_monitor_how){.sandbox = s.sandbox}, &p);
	}
	if (pid < 0) {
		oci_fail(x, "exec %s: fork: %s", s.id, strerror(errno));
		goto out_p;
	}
	if (pid_file && (errno = -oci_pid_file(pid_file, pid))) {
		oci_fail(x, "exec %s: pid file %s: %s", s.id, pid_file, strerror(errno));
		kill(pid, SIGKILL);
		goto out_p;
	}
	if (detach) {
		st = 0;
	} else {
		int ws;
		while (waitpid(pid, &ws, 0) < 0 && errno == EINTR)
			;
		st = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
	}
out_p:
	if (tty >= 0)
		close(tty);
	oci_process_free(&p);
out:
	oci_state_free(&s);
	close(dfd);
	return st;
}
