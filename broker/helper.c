/* Credential helper: build its input, run it without a shell under a timeout, parse its output.
 * The output buffer holding the secret is wiped before it is freed. */
#include "helper.h"
#include "errmsg.h"

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
			return errmsg(err, errlen, -EINVAL, "helper output line %zu has a NUL", lineno);
		eq = memchr(line, '=', ll);
		if (!eq || eq == line)
			return errmsg(err, errlen, -EINVAL, "helper output line %zu is not key=value",
				      lineno);
		vl = ll - (size_t)(eq + 1 - line);
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

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int helper_run(const struct cred_policy *c, int timeout_ms, struct secret *s, char *err,
	       size_t errlen)
{
	int in[2] = { -1, -1 }, out[2] = { -1, -1 }, status = 0, r, n;
	char input[8192], **argv = NULL;
	char *buf = NULL;
	size_t len = 0, inoff = 0, i;
	int64_t deadline = mono_ms() + timeout_ms;
	pid_t pid = -1;

	memset(s, 0, sizeof(*s));
	n = helper_input(c, input, sizeof(input));
	if (n < 0)
		return errmsg(err, errlen, n, "helper input too large");
	argv = calloc(c->helper.n + 2, sizeof(*argv));
	buf = malloc(HELPER_OUT_MAX + 1);
	if (!argv || !buf) {
		r = errmsg(err, errlen, -ENOMEM, "out of memory");
		goto out;
	}
	for (i = 0; i < c->helper.n; i++)
		argv[i] = c->helper.v[i];
	argv[i] = "get";
	if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC)) {
		r = errmsg(err, errlen, -errno, "pipe: %s", strerror(errno));
		goto out;
	}
	pid = fork();
	if (pid < 0) {
		r = errmsg(err, errlen, -errno, "fork: %s", strerror(errno));
		goto out;
	}
	if (pid == 0) {
		/* Child: only async-signal-safe calls until exec. */
		if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0)
			_exit(126);
		signal(SIGPIPE, SIG_DFL);
		execvp(argv[0], argv);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	in[0] = out[1] = -1;
	fcntl(in[1], F_SETFL, O_NONBLOCK);
	for (;;) {
		struct pollfd p[2] = { { .fd = out[0], .events = POLLIN },
				       { .fd = in[1], .events = POLLOUT } };
		int64_t left = deadline - mono_ms();
		ssize_t got;

		if (left <= 0) {
			r = errmsg(err, errlen, -ETIMEDOUT, "helper timed out after %d ms",
				   timeout_ms);
			goto out;
		}
		if (poll(p, in[1] >= 0 ? 2 : 1, (int)left) < 0) {
			if (errno == EINTR)
				continue;
			r = errmsg(err, errlen, -errno, "poll: %s", strerror(errno));
			goto out;
		}
		if (in[1] >= 0 && p[1].revents) {
			got = write(in[1], input + inoff, (size_t)n - inoff);
			if (got > 0)
				inoff += (size_t)got;
			if (got < 0 && errno != EAGAIN) /* helper closed stdin early: fine */
				inoff = (size_t)n;
			if (inoff == (size_t)n) {
				close(in[1]);
				in[1] = -1;
			}
		}
		if (p[0].revents) {
			got = read(out[0], buf + len, HELPER_OUT_MAX + 1 - len);
			if (got < 0 && errno == EINTR)
				continue;
			if (got < 0) {
				r = errmsg(err, errlen, -errno, "helper read: %s", strerror(errno));
				goto out;
			}
			if (got == 0)
				break;
			len += (size_t)got;
			if (len > HELPER_OUT_MAX) {
				r = errmsg(err, errlen, -E2BIG, "helper output over %d bytes",
					   HELPER_OUT_MAX);
				goto out;
			}
		}
	}
	/* stdout closed: give the helper the rest of the deadline to exit. */
	for (;;) {
		pid_t w = waitpid(pid, &status, WNOHANG);

		if (w == pid) {
			pid = -1;
			break;
		}
		if (w < 0 && errno != EINTR) {
			r = errmsg(err, errlen, -errno, "waitpid: %s", strerror(errno));
			goto out;
		}
		if (mono_ms() >= deadline) {
			r = errmsg(err, errlen, -ETIMEDOUT, "helper did not exit in %d ms",
				   timeout_ms);
			goto out;
		}
		usleep(2000);
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status)) {
		r = errmsg(err, errlen, -EIO, "helper %s failed (status %d)", c->helper.v[0],
			   WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
		goto out;
	}
	r = helper_parse(buf, len, s, err, errlen);
out:
	if (pid > 0) {
		kill(pid, SIGKILL);
		while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
			;
	}
	for (i = 0; i < 2; i++) {
		if (in[i] >= 0)
			close(in[i]);
		if (out[i] >= 0)
			close(out[i]);
	}
	if (buf)
		OPENSSL_cleanse(buf, HELPER_OUT_MAX + 1);
	free(buf);
	free(argv);
	OPENSSL_cleanse(input, sizeof(input));
	if (r)
		secret_wipe(s);
	return r;
}
