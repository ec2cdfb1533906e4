/* `cove ps [SANDBOX]`: sandboxes registered in the state dir, or one sandbox's exec sessions. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent_client.h"
#include "term_safe.h"

/* Room for a guest string once term_safe has escaped it (longer ones end in "..."). */
#define PS_TEXT_MAX 512

static const char ps_usage[] =
    "usage: cove ps [SANDBOX]\n"
    "Without SANDBOX: every sandbox registered in the state dir (${COVE_STATE_DIR:-\n"
    "$XDG_RUNTIME_DIR/cove or /run/cove}/NAME/vsock.sock; register one by giving cove run\n"
    "--vsock-uds that path), with the pid of the cove process serving it and its status.\n"
    "With SANDBOX: its exec sessions (ids for cove attach).\n";

/* The inode of the listening Unix socket bound to path, from /proc/net/unix; 0 if none. */
static unsigned long listen_inode(const char *path)
{
	FILE *f = fopen("/proc/net/unix", "re");
	char line[512];
	unsigned long found = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long flags, ino;
		char name[256] = "";

		/* Num RefCount Protocol Flags Type St Inode Path */
		if (sscanf(line, "%*s %*s %*s %lx %*s %*s %lu %255s", &flags, &ino, name) == 3 &&
		    (flags & 0x10000) && strcmp(name, path) == 0) {
			found = ino;
			break;
		}
	}
	fclose(f);
	return found;
}

/* The process holding socket inode ino open, or 0. */
static pid_t socket_owner(unsigned long ino)
{
	char want[64], fdpath[600], link[64];
	struct dirent *p;
	DIR *proc = opendir("/proc");
	pid_t found = 0;

	if (!proc || !ino) {
		if (proc)
			closedir(proc);
		return 0;
	}
	snprintf(want, sizeof(want), "socket:[%lu]", ino);
	while (!found && (p = readdir(proc))) {
		struct dirent *fdent;
		DIR *fds;

		if (p->d_name[0] < '1' || p->d_name[0] > '9')
			continue;
		snprintf(fdpath, sizeof(fdpath), "/proc/%s/fd", p->d_name);
		fds = opendir(fdpath);
		if (!fds)
			continue;
		while ((fdent = readdir(fds))) {
			ssize_t n;

			snprintf(fdpath, sizeof(fdpath), "/proc/%s/fd/%s", p->d_name,
				 fdent->d_name);
			n = readlink(fdpath, link, sizeof(link) - 1);
			if (n <= 0)
				continue;
			link[n] = '\0';
			if (strcmp(link, want) == 0) {
				found = (pid_t)atoi(p->d_name);
				break;
			}
		}
		closedir(fds);
	}
	closedir(proc);
	return found;
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
		pid = socket_owner(listen_inode(uds));
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
