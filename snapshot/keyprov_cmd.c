/*
 * The key-cmd provider: a user command wraps/unwraps base64 on stdin to base64 on stdout. The same
 * runner starts cove-pkcs11 (keyprov_pkcs11.c), so no PKCS#11 module is ever loaded into cove.
 */
#include "common/clock.h"
#include "snapshot/keyprov.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "common/errmsg.h"

#define STDOUT_MAX (KEYPROV_WRAPPED_MAX * 2 + 64) /* base64 of the largest blob, with newlines */
#define STDERR_MAX 1024

struct child {
	pid_t pid;
	int in, out, errfd; /* our ends */
};

static void close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

/* stdin is a socketpair so writing to a command that exited early is EPIPE, not SIGPIPE. */
static int spawn(const char *path, char *const argv[], struct child *c)
{
	int in[2] = {-1, -1}, out[2] = {-1, -1}, er[2] = {-1, -1};
	int r;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in) < 0 ||
	    pipe2(out, O_CLOEXEC) < 0 || pipe2(er, O_CLOEXEC) < 0) {
		r = -errno;
		goto fail;
	}
	/* The command gets default signal handling whatever cove's threads block or ignore. */
	sigset_t none;
	struct sigaction dfl = {.sa_handler = SIG_DFL};
	sigemptyset(&none);
	pid_t pid = fork();
	if (pid < 0) {
		r = -errno;
		goto fail;
	}
	if (pid == 0) {
		/* Only async-signal-safe calls from here to exec. */
		if (dup2(in[1], 0) < 0 || dup2(out[1], 1) < 0 || dup2(er[1], 2) < 0)
			_exit(127);
		close_range(3, ~0u, 0); /* no VM, socket or key fd leaks into the command */
		sigaction(SIGPIPE, &dfl, NULL);
		sigprocmask(SIG_SETMASK, &none, NULL);
		execv(path, argv);
		_exit(127);
	}
	close(in[1]);
	close(out[1]);
	close(er[1]);
	c->pid = pid;
	c->in = in[0];
	c->out = out[0];
	c->errfd = er[0];
	fcntl(c->in, F_SETFL, O_NONBLOCK);
	fcntl(c->out, F_SETFL, O_NONBLOCK);
	fcntl(c->errfd, F_SETFL, O_NONBLOCK);
	return 0;
fail:
	for (int i = 0; i < 2; i++) {
		close_fd(&in[i]);
		close_fd(&out[i]);
		close_fd(&er[i]);
	}
	return r;
}

/* Read what is there into buf; 1 at EOF, 0 for more later, -EMSGSIZE past cap, -errno. */
static int drain(int fd, char *buf, size_t cap, size_t *len, int truncate_ok)
{
	for (;;) {
		char tmp[1024];
		ssize_t n = read(fd, tmp, sizeof(tmp));
		if (n == 0)
			return 1;
		if (n < 0)
			return errno == EAGAIN ? 0 : errno == EINTR ? 0 : -errno;
		size_t room = cap - *len;
		if ((size_t)n > room && !truncate_ok) {
			OPENSSL_cleanse(tmp, sizeof(tmp));
			return -EMSGSIZE;
		}
		size_t take = (size_t)n < room ? (size_t)n : room;
		memcpy(buf + *len, tmp, take);
		*len += take;
		OPENSSL_cleanse(tmp, sizeof(tmp));
	}
}

/* The first non-empty line of the command's stderr, printable, for the error message. */
static void first_line(const char *buf, size_t len, char *line, size_t cap)
{
	size_t i = 0, o = 0;
	while (i < len && (buf[i] == '\n' || buf[i] == '\r' || buf[i] == ' '))
		i++;
	for (; i < len && buf[i] != '\n' && o + 1 < cap; i++)
		line[o++] = (buf[i] >= 0x20 && buf[i] < 0x7f) ? buf[i] : '?';
	line[o] = 0;
}

/* Decode base64 with whitespace anywhere; -EINVAL on anything else. */
static int b64_decode(char *txt, size_t len, uint8_t *out, size_t cap, size_t *out_len)
{
	size_t n = 0;
	for (size_t i = 0; i < len; i++) {
		char ch = txt[i];
		if (ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t')
			continue;
		txt[n++] = ch;
	}
	if (n == 0 || n % 4)
		return -EINVAL;
	if ((n / 4) * 3 > cap + 2)
		return -EMSGSIZE;
	uint8_t *tmp = malloc(n / 4 * 3 + 1);
	if (!tmp)
		return -ENOMEM;
	int d = EVP_DecodeBlock(tmp, (unsigned char *)txt, (int)n);
	int r = 0;
	if (d < 0) {
		r = -EINVAL;
		goto out;
	}
	size_t pad = (txt[n - 1] == '=') + (txt[n - 2] == '=');
	size_t got = (size_t)d - pad;
	if (got > cap) {
		r = -EMSGSIZE;
		goto out;
	}
	memcpy(out, tmp, got);
	*out_len = got;
out:
	OPENSSL_cleanse(tmp, n / 4 * 3 + 1);
	free(tmp);
	return r;
}

int keyprov_exec_run(const struct keyprov_exec *x, const uint8_t *in, size_t in_len, uint8_t *out,
		     size_t cap, size_t *out_len, char *err, size_t errlen)
{
	struct child c = {.pid = -1, .in = -1, .out = -1, .errfd = -1};
	const char *cmdline = x->name, *op = x->op;
	size_t enc_cap = (in_len + 2) / 3 * 4 + 2;
	char *enc = malloc(enc_cap);
	char *obuf = malloc(STDOUT_MAX);
	char ebuf[STDERR_MAX];
	size_t olen = 0, elen = 0, sent = 0;
	int r, status = 0;
	if (!enc || !obuf) {
		r = errmsg(err, errlen, -ENOMEM, "%s: out of memory", x->label);
		goto out_free;
	}
	int elen_enc = EVP_EncodeBlock((unsigned char *)enc, in, (int)in_len);
	enc[elen_enc] = '\n';
	size_t to_send = (size_t)elen_enc + 1;

	r = spawn(x->path, x->argv, &c);
	if (r) {
		r = errmsg(err, errlen, r, "%s: cannot start %s: %s", x->label, x->path,
			   strerror(-r));
		goto out_free;
	}
	double deadline = mono_s() + KEYPROV_CMD_TIMEOUT_S;
	int out_eof = 0, err_eof = 0;
	while (!out_eof || !err_eof) {
		struct pollfd p[3];
		int np = 0;
		if (c.in >= 0)
			p[np++] = (struct pollfd){.fd = c.in, .events = POLLOUT};
		if (!out_eof)
			p[np++] = (struct pollfd){.fd = c.out, .events = POLLIN};
		if (!err_eof)
			p[np++] = (struct pollfd){.fd = c.errfd, .events = POLLIN};
		double left = deadline - mono_s();
		if (left <= 0) {
			r = errmsg(err, errlen, -ETIMEDOUT, "%s '%s %s' timed out after %d s",
				   x->label, cmdline, op, KEYPROV_CMD_TIMEOUT_S);
			goto out_kill;
		}
		int n = poll(p, (nfds_t)np, (int)(left * 1000) + 1);
		if (n < 0 && errno != EINTR) {
			r = errmsg(err, errlen, -errno, "%s: poll: %s", x->label, strerror(errno));
			goto out_kill;
		}
		if (c.in >= 0) {
			ssize_t w = send(c.in, enc + sent, to_send - sent, MSG_NOSIGNAL);
			if (w > 0)
				sent += (size_t)w;
			/* A command that does not read its input is its own business. */
			if (sent == to_send || (w < 0 && errno != EAGAIN && errno != EINTR))
				close_fd(&c.in);
		}
		if (!out_eof) {
			int d = drain(c.out, obuf, STDOUT_MAX, &olen, 0);
			if (d == -EMSGSIZE) {
				r = errmsg(err, errlen, -EMSGSIZE,
					   "%s '%s %s' wrote more than %d bytes", x->label, cmdline,
					   op, STDOUT_MAX);
				goto out_kill;
			}
			out_eof = d != 0;
		}
		if (!err_eof)
			err_eof = drain(c.errfd, ebuf, sizeof(ebuf), &elen, 1) != 0;
	}
	close_fd(&c.in);
	while (waitpid(c.pid, &status, 0) < 0) {
		if (errno != EINTR) {
			r = errmsg(err, errlen, -errno, "%s: waitpid: %s", x->label,
				   strerror(errno));
			goto out_free;
		}
	}
	c.pid = -1;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		char line[200];
		first_line(ebuf, elen, line, sizeof(line));
		/* cove's own helper exits with the errno of what failed and says it in one line. */
		if (WIFEXITED(status) && x->exit_is_errno && *line)
			r = errmsg(err, errlen, -WEXITSTATUS(status), "%s", line);
		else if (WIFEXITED(status))
			r = errmsg(err, errlen, -EKEYREJECTED, "%s %s exited with status %d%s%s",
				   x->label, op, WEXITSTATUS(status), *line ? ": " : "", line);
		else
			r = errmsg(err, errlen, -EKEYREJECTED, "%s %s killed by signal %d%s%s",
				   x->label, op, WTERMSIG(status), *line ? ": " : "", line);
		goto out_free;
	}
	r = b64_decode(obuf, olen, out, cap, out_len);
	if (r == -EMSGSIZE)
		r = errmsg(err, errlen, r, "%s %s output is larger than %zu bytes", x->label, op,
			   cap);
	else if (r)
		r = errmsg(err, errlen, r, "%s %s did not print base64 on stdout", x->label, op);
	goto out_free;
out_kill:
	kill(c.pid, SIGKILL);
	while (waitpid(c.pid, &status, 0) < 0 && errno == EINTR)
		;
out_free:
	close_fd(&c.in);
	close_fd(&c.out);
	close_fd(&c.errfd);
	if (enc)
		OPENSSL_cleanse(enc, enc_cap);
	if (obuf)
		OPENSSL_cleanse(obuf, STDOUT_MAX);
	free(enc);
	free(obuf);
	return r;
}

int keyprov_cmd_run(const char *cmdline, const char *op, const uint8_t *in, size_t in_len,
		    uint8_t *out, size_t cap, size_t *out_len, char *err, size_t errlen)
{
	size_t script_len = strlen(cmdline) + 8;
	char *script = malloc(script_len);
	if (!script)
		return errmsg(err, errlen, -ENOMEM, "key-cmd: out of memory");
	snprintf(script, script_len, "%s \"$@\"", cmdline);
	char *argv[] = {"sh", "-c", script, "cove-key-cmd", (char *)op, NULL};
	struct keyprov_exec x = {
	    .label = "key-cmd", .name = cmdline, .op = op, .path = "/bin/sh", .argv = argv};
	int r = keyprov_exec_run(&x, in, in_len, out, cap, out_len, err, errlen);
	free(script);
	return r;
}
