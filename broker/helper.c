/* Credential helper: build its input, run it without a shell under a timeout, parse its output.
 * The output buffer holding the secret is wiped before it is freed. */
#include "helper.h"
#include "common/clock.h"
#include "common/errmsg.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <sys/socket.h>
#include <unistd.h>

void secret_wipe(struct secret *s)
{
	OPENSSL_cleanse(s, sizeof(*s));
}

int helper_input(const struct cred_policy *c, char *buf, size_t cap)
{
	size_t i, o = 0;
	int n;

	for (i = 0; i < c->input_keys.n; i++) {
		n = snprintf(buf + o, cap - o, "%s=%s\n", c->input_keys.v[i], c->input_vals.v[i]);
		if (n < 0 || (size_t)n >= cap - o)
			return -E2BIG;
		o += (size_t)n;
	}
	if (o + 1 >= cap)
		return -E2BIG;
	buf[o++] = '\n';
	buf[o] = '\0';
	return (int)o;
}

int helper_parse(const char *out, size_t len, struct secret *s, char *err, size_t errlen)
{
	size_t pos = 0, lineno = 0;

	memset(s, 0, sizeof(*s));
	if (len > HELPER_OUT_MAX)
		return errmsg(err, errlen, -E2BIG, "helper output over %d bytes", HELPER_OUT_MAX);
	while (pos < len) {
		const char *line = out + pos, *nl = memchr(line, '\n', len - pos), *eq;
		size_t ll = nl ? (size_t)(nl - line) : len - pos, vl;

		lineno++;
		pos += ll + (nl ? 1 : 0);
		if (ll && line[ll - 1] == '\r')
			ll--;
		if (ll == 0)
			break; /* blank line ends the answer */
		if (memchr(line, '\0', ll))
			return errmsg(err, errlen, -EINVAL, "helper output line %zu has a NUL",
				      lineno);
		eq = memchr(line, '=', ll);
		if (!eq || eq == line)
			return errmsg(err, errlen, -EINVAL,
				      "helper output line %zu is not key=value", lineno);
		vl = ll - (size_t)(eq + 1 - line);
		for (size_t k = 0; k < vl; k++)
			if ((unsigned char)eq[1 + k] < 0x20 || eq[1 + k] == 0x7f)
				return errmsg(err, errlen, -EINVAL,
					      "helper output line %zu has a control byte", lineno);
		if ((size_t)(eq - line) == 8 && !memcmp(line, "password", 8)) {
			if (vl >= sizeof(s->password))
				return errmsg(err, errlen, -E2BIG, "helper password over %zu bytes",
					      sizeof(s->password) - 1);
			memcpy(s->password, eq + 1, vl);
			s->password[vl] = '\0';
		} else if ((size_t)(eq - line) == 8 && !memcmp(line, "username", 8)) {
			if (vl >= sizeof(s->username))
				return errmsg(err, errlen, -E2BIG, "helper username over %zu bytes",
					      sizeof(s->username) - 1);
			memcpy(s->username, eq + 1, vl);
			s->username[vl] = '\0';
		}
	}
	if (!s->password[0] && !s->username[0])
		return errmsg(err, errlen, -EINVAL, "helper gave no password= or username=");
	return 0;
}

int helper_spawn(const struct cred_policy *c, int timeout_ms, struct helper_proc *hp, char *err,
		 size_t errlen)
{
	int in[2] = {-1, -1}, out[2] = {-1, -1}, r, n;
	char input[HELPER_IN_MAX], **argv = NULL;
	size_t i;
	ssize_t w;

	memset(hp, 0, sizeof(*hp));
	hp->pid = -1;
	hp->out_fd = -1;
	hp->deadline_ns = (int64_t)mono_ns() + (int64_t)timeout_ms * 1000000;
	n = helper_input(c, input, sizeof(input));
	if (n < 0)
		return errmsg(err, errlen, n, "helper input over %d bytes", HELPER_IN_MAX);
	argv = calloc(c->helper.n + 2, sizeof(*argv));
	hp->buf = malloc(HELPER_OUT_MAX + 1);
	if (!argv || !hp->buf) {
		r = errmsg(err, errlen, -ENOMEM, "out of memory");
		goto fail;
	}
	for (i = 0; i < c->helper.n; i++)
		argv[i] = c->helper.v[i];
	argv[i] = "get";
	/* stdin is a socket: a helper that exits unread costs EPIPE (MSG_NOSIGNAL), not a
	 * SIGPIPE that would kill a caller that did not ignore it. */
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in) ||
	    pipe2(out, O_CLOEXEC | O_NONBLOCK)) {
		r = errmsg(err, errlen, -errno, "pipe: %s", strerror(errno));
		goto fail;
	}
	hp->pid = fork();
	if (hp->pid < 0) {
		r = errmsg(err, errlen, -errno, "fork: %s", strerror(errno));
		goto fail;
	}
	if (hp->pid == 0) {
		/* Child: only async-signal-safe calls until exec. stdout must block. Its own
		 * process group, so a timeout kills what it started too (pass -> gpg). */
		setpgid(0, 0);
		if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0 || fcntl(1, F_SETFL, 0) < 0)
			_exit(126);
		signal(SIGPIPE, SIG_DFL);
		execvp(argv[0], argv);
		_exit(127);
	}
	setpgid(hp->pid, hp->pid); /* also here: no window where a kill misses the group */
	close(in[0]);
	close(out[1]);
	in[0] = out[1] = -1;
	/* The input (< HELPER_IN_MAX) fits the socket buffer: send it all now and close stdin. A
	 * helper that exits without reading makes this fail with EPIPE, which is fine. */
	w = send(in[1], input, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
	(void)w;
	close(in[1]);
	in[1] = -1;
	OPENSSL_cleanse(input, sizeof(input));
	hp->out_fd = out[0];
	free(argv);
	return 0;
fail:
	for (i = 0; i < 2; i++) {
		if (in[i] >= 0)
			close(in[i]);
		if (out[i] >= 0)
			close(out[i]);
	}
	free(argv);
	helper_abort(hp);
	return r;
}

int helper_read(struct helper_proc *hp, char *err, size_t errlen)
{
	for (;;) {
		ssize_t got = read(hp->out_fd, hp->buf + hp->len, HELPER_OUT_MAX + 1 - hp->len);

		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0 && errno == EAGAIN)
			return 0;
		if (got < 0)
			return errmsg(err, errlen, -errno, "helper read: %s", strerror(errno));
		if (got == 0) {
			hp->eof = 1;
			return 1;
		}
		hp->len += (size_t)got;
		if (hp->len > HELPER_OUT_MAX)
			return errmsg(err, errlen, -E2BIG, "helper output over %d bytes",
				      HELPER_OUT_MAX);
	}
}

int helper_finish(struct helper_proc *hp, struct secret *s, char *err, size_t errlen)
{
	int status = 0, r;
	pid_t w;

	memset(s, 0, sizeof(*s));
	if (hp->out_fd >= 0) {
		close(hp->out_fd);
		hp->out_fd = -1;
	}
	if (!hp->eof) {
		r = (int64_t)mono_ns() >= hp->deadline_ns
			? errmsg(err, errlen, -ETIMEDOUT, "helper timed out")
			: errmsg(err, errlen, -EIO, "helper output unreadable or over the cap");
		helper_abort(hp);
		return r;
	}
	w = waitpid(hp->pid, &status, WNOHANG);
	if (w == 0 && (int64_t)mono_ns() < hp->deadline_ns)
		return -EAGAIN; /* stdout closed, not exited yet: ask again soon */
	if (w != hp->pid) {
		r = errmsg(err, errlen, -ETIMEDOUT, "helper did not exit in time");
		helper_abort(hp);
		return r;
	}
	hp->pid = -1;
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		r = errmsg(err, errlen, -EIO, "helper failed (status %d)",
			   WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
	else
		r = helper_parse(hp->buf, hp->len, s, err, errlen);
	helper_abort(hp);
	if (r)
		secret_wipe(s);
	return r;
}

void helper_abort(struct helper_proc *hp)
{
	int status;

	if (hp->pid > 0) {
		kill(-hp->pid, SIGKILL);
		kill(hp->pid, SIGKILL);
		while (waitpid(hp->pid, &status, 0) < 0 && errno == EINTR)
			;
	}
	hp->pid = -1;
	if (hp->out_fd >= 0)
		close(hp->out_fd);
	hp->out_fd = -1;
	if (hp->buf) {
		OPENSSL_cleanse(hp->buf, HELPER_OUT_MAX + 1);
		free(hp->buf);
	}
	hp->buf = NULL;
	hp->len = 0;
}

int helper_run(const struct cred_policy *c, int timeout_ms, struct secret *s, char *err,
	       size_t errlen)
{
	struct helper_proc hp;
	int r = helper_spawn(c, timeout_ms, &hp, err, errlen);

	if (r)
		return r;
	for (;;) {
		struct pollfd p = {.fd = hp.out_fd, .events = POLLIN};
		int64_t left = (hp.deadline_ns - (int64_t)mono_ns() + 999999) / 1000000;

		if (hp.out_fd >= 0) {
			if (left <= 0)
				break;
			if (poll(&p, 1, (int)left) < 0 && errno != EINTR)
				break;
			r = helper_read(&hp, err, errlen);
			if (r == 0)
				continue;
			if (r < 0) {
				helper_abort(&hp);
				return r;
			}
		}
		r = helper_finish(&hp, s, err, errlen);
		if (r != -EAGAIN)
			return r;
		usleep(2000);
	}
	return helper_finish(&hp, s, err, errlen);
}
