/* cove-oci's errors and its calls of cove (cli/oci.h). */
#include "cli/oci.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define OUTPUT_MAX (64 << 10)

int oci_fail(struct oci_ctx *x, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	log_err(x->log, "%s", line);
	if (x->log->out && x->log->out != stderr)
		fprintf(stderr, "cove-oci: %s\n", line);
	return 1;
}

int oci_cove_path(char *path, size_t cap)
{
	char self[4096];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n < 0)
		return -errno;
	self[n] = '\0';
	char *slash = strrchr(self, '/');
	if (slash)
		*slash = '\0';
	return (size_t)snprintf(path, cap, "%s/cove", slash ? self : ".") < cap ? 0 : -ENAMETOOLONG;
}

/* The last non-empty line of buf into out. */
static void last_line(char *buf, size_t len, char *out, size_t cap)
{
	while (len && (buf[len - 1] == '\n' || buf[len - 1] == ' '))
		len--;
	buf[len] = '\0';
	char *nl = strrchr(buf, '\n');
	snprintf(out, cap, "%s", nl ? nl + 1 : buf);
}

int oci_cove(struct oci_ctx *x, const char *const *argv)
{
	char cove[4200];
	int pfd[2], r = oci_cove_path(cove, sizeof(cove));
	if (r)
		return r;
	if (pipe2(pfd, O_CLOEXEC) < 0)
		return -errno;
	pid_t pid = fork();
	if (pid < 0) {
		r = -errno;
		close(pfd[0]);
		close(pfd[1]);
		return r;
	}
	if (pid == 0) {
		int null = open("/dev/null", O_RDONLY);
		if (null < 0 || dup2(null, 0) < 0 || dup2(pfd[1], 1) < 0 || dup2(pfd[1], 2) < 0)
			_exit(127);
		execv(cove, (char *const *)argv);
		dprintf(2, "cannot run %s: %s\n", cove, strerror(errno));
		_exit(127);
	}
	close(pfd[1]);
	char *buf = malloc(OUTPUT_MAX + 1);
	size_t len = 0;
	ssize_t n;
	char sink[4096];
	/* Keep the tail: the last line says why it failed. */
	while ((n = read(pfd[0], sink, sizeof(sink))) > 0 || (n < 0 && errno == EINTR)) {
		if (n <= 0 || !buf)
			continue;
		if (len + (size_t)n > OUTPUT_MAX) {
			size_t drop = len + (size_t)n - OUTPUT_MAX;
			memmove(buf, buf + drop, len - drop);
			len -= drop;
		}
		memcpy(buf + len, sink, (size_t)n);
		len += (size_t)n;
	}
	close(pfd[0]);
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -errno;
	int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	if (buf) {
		if (len)
			log_debug(x->log, "cove %s: %.*s", argv[1], (int)len, buf);
		if (code)
			last_line(buf, len, x->err, sizeof(x->err));
		free(buf);
	}
	return code;
}

int oci_sandbox_rm(struct oci_ctx *x, const char *sandbox)
{
	const char *argv[] = {"cove", "rm", sandbox, NULL};
	return oci_cove(x, argv);
}

char **oci_exec_argv(const char *cove, const char *sandbox, const struct oci_process *p, char *user,
		     size_t usercap, const char *session_file)
{
	/* One block: the pointers, then the --rlimit arguments they point to. */
	size_t nptr = 14 + 2 * p->nenv + 2 * p->nrlimits + p->nargs;
	char **a = calloc(1, nptr * sizeof(char *) + p->nrlimits * RLIMIT_ARG_MAX);
	size_t k = 0;
	if (!a)
		return NULL;
	char *rl = (char *)(a + nptr);
	snprintf(user, usercap, "%u:%u", p->uid, p->gid);
	a[k++] = (char *)cove;
	a[k++] = "exec";
	a[k++] = (char *)sandbox;
	if (session_file) {
		a[k++] = "--session-file";
		a[k++] = (char *)session_file;
	}
	if (p->terminal)
		a[k++] = "--tty";
	for (size_t i = 0; i < p->nenv; i++) {
		a[k++] = "--env";
		a[k++] = p->env[i];
	}
	a[k++] = "--cwd";
	a[k++] = (char *)p->cwd;
	a[k++] = "--user";
	a[k++] = user;
	for (size_t i = 0; i < p->nrlimits; i++, rl += RLIMIT_ARG_MAX) {
		if (rlimit_arg_format(&p->rlimits[i], rl, RLIMIT_ARG_MAX)) {
			free(a);
			return NULL;
		}
		a[k++] = "--rlimit";
		a[k++] = rl;
	}
	a[k++] = "--";
	for (size_t i = 0; i < p->nargs; i++)
		a[k++] = p->args[i];
	a[k] = NULL;
	return a;
}

int oci_pid_file(const char *path, pid_t pid)
{
	char tmp[PATH_MAX + 32], buf[24];
	if ((size_t)snprintf(tmp, sizeof(tmp), "%s.cove-oci-tmp", path) >= sizeof(tmp))
		return -ENAMETOOLONG;
	int n = snprintf(buf, sizeof(buf), "%d", (int)pid);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0)
		return -errno;
	int r = write(fd, buf, (size_t)n) == n ? 0 : -EIO;
	close(fd);
	if (!r && rename(tmp, path) < 0)
		r = -errno;
	if (r)
		unlink(tmp);
	return r;
}
