/* identity_machine.c: which machine a guest is after an identity event: its hostname, its
 * /etc/machine-id, and the hooks a guest that became a new machine runs (identity.d). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent.h"
#include "cove-init.h"

#define MACHINE_ID_FILE "/etc/machine-id"
#define MACHINE_ID_TMP	"/etc/.machine-id.cove"
#define HOOKS_MAX	64
#define HOOKS_WAIT_S	120 /* all hooks together; past it the host gets its answer anyway */

bool identity_hostname_valid(const char *h)
{
	size_t n = strlen(h);

	if (n == 0 || n > INIT_HOSTNAME_MAX || h[0] == '-' || h[0] == '.')
		return false;
	for (; *h; h++)
		if (!((*h >= 'a' && *h <= 'z') || (*h >= 'A' && *h <= 'Z') ||
		      (*h >= '0' && *h <= '9') || *h == '-' || *h == '.'))
			return false;
	return true;
}

bool identity_machine_id_valid(const char *id)
{
	bool nonzero = false;

	if (strlen(id) != MACHINE_ID_HEX)
		return false;
	for (; *id; id++) {
		if (!((*id >= '0' && *id <= '9') || (*id >= 'a' && *id <= 'f')))
			return false;
		nonzero |= *id != '0';
	}
	return nonzero;
}

/* 1 when /etc/machine-id already holds id, 0 when it holds something else or nothing. */
static int machine_id_is(const char *id)
{
	char buf[MACHINE_ID_HEX + 2];
	int fd = open(MACHINE_ID_FILE, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	ssize_t n;

	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf));
	close(fd);
	return n >= MACHINE_ID_HEX && !memcmp(buf, id, MACHINE_ID_HEX) &&
	       (n == MACHINE_ID_HEX || buf[MACHINE_ID_HEX] == '\n');
}

/* id into /etc/machine-id (0444, as systemd leaves it): a temp file renamed over it. */
static int machine_id_write(const char *id)
{
	char line[MACHINE_ID_HEX + 1];
	int fd, ret = 0;

	memcpy(line, id, MACHINE_ID_HEX);
	line[MACHINE_ID_HEX] = '\n';
	unlink(MACHINE_ID_TMP);
	fd = open(MACHINE_ID_TMP, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444);
	if (fd < 0)
		return -errno;
	if (write(fd, line, sizeof(line)) != (ssize_t)sizeof(line) || fsync(fd) < 0)
		ret = errno ? -errno : -EIO;
	close(fd);
	if (!ret && rename(MACHINE_ID_TMP, MACHINE_ID_FILE) < 0)
		ret = -errno;
	if (ret)
		unlink(MACHINE_ID_TMP);
	return ret;
}

static int hook_name(const struct dirent *e)
{
	return e->d_name[0] != '.';
}

/*
 * The executable regular files in IDENTITY_HOOK_DIR, in name order, into paths (malloc'd each):
 * their number.
 */
static int hooks_list(char *paths[HOOKS_MAX])
{
	struct dirent **list = NULL;
	int n = scandir(IDENTITY_HOOK_DIR, &list, hook_name, alphasort), k = 0;

	for (int i = 0; i < n; i++) {
		char p[512];
		struct stat st;

		if (k < HOOKS_MAX &&
		    (size_t)snprintf(p, sizeof(p), "%s/%s", IDENTITY_HOOK_DIR, list[i]->d_name) <
			sizeof(p) &&
		    stat(p, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0111))
			paths[k++] = strdup(p);
		free(list[i]);
	}
	free(list);
	for (int i = 0; i < k; i++)
		if (!paths[i])
			return i;
	return k;
}

/*
 * Runs the hooks one after another in a child of its own (its hooks are its children: the
 * agent's reaper, which waits for any child of the agent, never takes their statuses), which
 * writes the number that failed to a pipe. The agent's reaper reaps that child. Returns the
 * number that failed, or -ETIMEDOUT when they took longer than HOOKS_WAIT_S, or -errno.
 */
static int hooks_run(struct agent *ag, char *const paths[], int n, const char *hostname,
		     const char *machine_id)
{
	int p[2], ret;
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	pthread_mutex_lock(&ag->lock);
	pid = fork();
	if (pid == 0) {
		unsigned char failed = 0;
		sigset_t none;

		/* The agent's threads block signals they take from a signalfd: not the hooks. */
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		close(p[0]);
		alarm(HOOKS_WAIT_S);
		if (hostname)
			setenv("COVE_HOSTNAME", hostname, 1);
		setenv("COVE_MACHINE_ID", machine_id, 1);
		for (int i = 0; i < n; i++) {
			pid_t h = fork();
			int st;

			if (h == 0) {
				execl(paths[i], paths[i], (char *)NULL);
				_exit(127);
			}
			if (h < 0 || waitpid(h, &st, 0) != h || !WIFEXITED(st) || WEXITSTATUS(st))
				failed += failed < 255;
		}
		if (write(p[1], &failed, 1) != 1)
			_exit(1);
		_exit(0);
	}
	if (pid > 0) {
		ag->spawns++;
		pthread_cond_broadcast(&ag->child_cond);
	}
	pthread_mutex_unlock(&ag->lock);
	close(p[1]);
	if (pid < 0) {
		close(p[0]);
		return -errno;
	}
	struct pollfd pf = {.fd = p[0], .events = POLLIN};
	unsigned char failed;

	ret = poll(&pf, 1, (HOOKS_WAIT_S + 5) * 1000);
	if (ret > 0 && read(p[0], &failed, 1) == 1)
		ret = failed;
	else
		ret = -ETIMEDOUT;
	close(p[0]);
	return ret;
}

int identity_machine_apply(struct agent *ag, const char *hostname, const char *machine_id,
			   bool *new_machine)
{
	char *paths[HOOKS_MAX];
	int n, ret;

	*new_machine = false;
	/* Test mode runs on a developer's machine: never touch its hostname or /etc. */
	if (ag->test_uds)
		return 0;
	if (hostname && sethostname(hostname, strlen(hostname)) < 0)
		init_err(ag->log, "identity: sethostname %s: %s", hostname, strerror(errno));
	if (!machine_id || machine_id_is(machine_id))
		return 0;
	ret = machine_id_write(machine_id);
	if (ret < 0) {
		init_err(ag->log, "identity: %s: %s", MACHINE_ID_FILE, strerror(-ret));
		return ret;
	}
	*new_machine = true;
	n = hooks_list(paths);
	if (n > 0) {
		ret = hooks_run(ag, paths, n, hostname, machine_id);
		if (ret)
			init_err(ag->log, "identity: %s: %s", IDENTITY_HOOK_DIR,
				 ret < 0 ? "hooks did not finish in time" : "a hook failed");
		else
			init_info(ag->log, "identity: new machine %s, %d hook(s) ran", machine_id,
				  n);
	}
	for (int i = 0; i < n; i++)
		free(paths[i]);
	return 0;
}
