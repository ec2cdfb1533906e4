/* `cove ps [SANDBOX]`: sandboxes registered in the state dir, or one sandbox's exec sessions. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sandbox/agent_client.h"
#include "common/term_safe.h"
#include "common/unix_sock.h"

/* Room for a guest string once term_safe has escaped it (longer ones end in "..."). */
#define PS_TEXT_MAX 512

static const char ps_usage[] =
    "usage: cove ps [SANDBOX]\n"
    "Without SANDBOX: every sandbox registered in the runtime dir (${COVE_RUN_DIR:-\n"
    "$XDG_RUNTIME_DIR/cove or /run/cove}/NAME/vsock.sock; register one by giving cove run\n"
    "--vsock-uds that path), with the pid of the cove process serving it and its status.\n"
    "With SANDBOX: its exec sessions (ids for cove attach).\n";

/* The pid of the process that listens on the Unix socket at path (SO_PEERCRED of a connection,
 * which names the listener), or 0 when nothing listens. cove processes are not dumpable, so
 * their /proc/PID/fd cannot be searched by the same uid. The connection is closed before it
 * sends a byte, which the vsock device takes as an abandoned handshake. */
static pid_t socket_owner(const char *path)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	pid_t pid = 0;
	int fd = unix_connect(path, SOCK_NONBLOCK, 0);

	if (fd < 0)
		return 0;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0)
		pid = cred.pid;
	close(fd);
	return pid;
}

static json_t *agent_status(const char *uds, char *err, size_t errlen)
{
	json_t *req = json_pack("{s:s}", "op", "status"), *reply = NULL;
	int fd = agent_call(uds, 0, req, &reply, err, errlen);

	json_decref(req);
	if (fd < 0)
		return NULL;
	close(fd);
	return reply;
}

static int list_sandboxes(void)
{
	char dir[AGENT_PATH_MAX], uds[AGENT_PATH_MAX * 2], err[512], sname[PS_TEXT_MAX];
	char serr[PS_TEXT_MAX];
	struct dirent **names;
	int n;

	if (agent_state_dir(dir, sizeof(dir)) < 0) {
		fprintf(stderr, "cove ps: state directory path too long\n");
		return 1;
	}
	n = scandir(dir, &names, NULL, alphasort);
	if (n < 0) {
		if (errno == ENOENT) {
			printf("%-20s %-8s %s\n", "NAME", "PID", "STATUS");
			return 0;
		}
		fprintf(stderr, "cove ps: %s: %s\n", dir, strerror(errno));
		return 1;
	}
	printf("%-20s %-8s %s\n", "NAME", "PID", "STATUS");
	for (int i = 0; i < n; i++) {
		const char *name = names[i]->d_name;
		struct stat st;
		pid_t pid;

		if (name[0] == '.' ||
		    snprintf(uds, sizeof(uds), "%s/%s/vsock.sock", dir, name) >= (int)sizeof(uds) ||
		    stat(uds, &st) < 0 || !S_ISSOCK(st.st_mode)) {
			free(names[i]);
			continue;
		}
		pid = socket_owner(uds);
		term_safe(name, sname, sizeof(sname));
		if (!pid) {
			printf("%-20s %-8s %s\n", sname, "-",
			       "stale (no process serves vsock.sock)");
		} else {
			json_t *s = agent_status(uds, err, sizeof(err));

			if (s)
				printf("%-20s %-8d running (agent epoch %lld, %zu sessions)\n",
				       sname, (int)pid,
				       (long long)json_integer_value(json_object_get(s, "epoch")),
				       json_array_size(json_object_get(s, "sessions")));
			else
				printf("%-20s %-8d running (agent: %s)\n", sname, (int)pid,
				       term_safe(err, serr, sizeof(serr)));
			json_decref(s);
		}
		free(names[i]);
	}
	free(names);
	return 0;
}

static int list_sessions(const char *sandbox)
{
	char uds[AGENT_PATH_MAX], err[512], safe[PS_TEXT_MAX], id[64], argv0[PS_TEXT_MAX];
	json_t *s, *sess;
	size_t i;

	if (agent_resolve(sandbox, uds, sizeof(uds), err, sizeof(err)) < 0) {
		fprintf(stderr, "cove ps: %s\n", term_safe(err, safe, sizeof(safe)));
		return 1;
	}
	s = agent_status(uds, err, sizeof(err));
	if (!s) {
		fprintf(stderr, "cove ps: %s\n", term_safe(err, safe, sizeof(safe)));
		return 1;
	}
	printf("%-8s %-8s %-8s %-9s %s\n", "SESSION", "PID", "STATE", "ATTACHED", "COMMAND");
	/* Everything in a session entry comes from the guest. */
	json_array_foreach(json_object_get(s, "sessions"), i, sess)
	{
		printf("%-8s %-8lld %-8s %-9s %s%s\n",
		       term_safe(json_string_value(json_object_get(sess, "id")), id, sizeof(id)),
		       (long long)json_integer_value(json_object_get(sess, "pid")),
		       json_is_true(json_object_get(sess, "running")) ? "running" : "exited",
		       json_is_true(json_object_get(sess, "attached")) ? "yes" : "no",
		       term_safe(json_string_value(json_object_get(sess, "argv0")), argv0,
				 sizeof(argv0)),
		       json_is_true(json_object_get(sess, "tty")) ? " (tty)" : "");
	}
	json_decref(s);
	return 0;
}

int cmd_ps(int argc, char **argv)
{
	if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
		fputs(ps_usage, stdout);
		return 0;
	}
	if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
		fprintf(stderr, "cove ps: unexpected argument '%s' (try 'cove ps --help')\n",
			argv[argc - 1]);
		return 2;
	}
	return argc == 2 ? list_sessions(argv[1]) : list_sandboxes();
}
