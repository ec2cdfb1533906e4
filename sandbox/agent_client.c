/* Host side of the cove-init agent protocol: framing, sandbox names, sessions, identity events. */
#include "sandbox/agent_client.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "common/base64.h"
#include "common/clock.h"
#include "common/errmsg.h"
#include "common/unix_sock.h"
#include "common/hex.h"
#include "common/term_safe.h"

#define CHUNK 65536

/* {"exit_code":N,"signal":S} -> N, or 128 + S for a command killed by a signal. */
int agent_exit_parse(const char *buf, size_t len, int *status)
{
	json_t *j, *code, *sig;
	int ret = wire_msg_parse(buf, len, &j, NULL, 0);

	if (ret < 0)
		return ret;
	code = json_object_get(j, "exit_code");
	sig = json_object_get(j, "signal");
	ret = -EINVAL;
	if (json_is_integer(sig) && json_integer_value(sig) > 0 && json_integer_value(sig) < 128) {
		*status = 128 + (int)json_integer_value(sig);
		ret = 0;
	} else if (json_is_integer(code) && json_integer_value(code) >= 0 &&
		   json_integer_value(code) <= 255) {
		*status = (int)json_integer_value(code);
		ret = 0;
	}
	json_decref(j);
	return ret;
}

/* The hybrid vsock handshake's answer: "OK <port>" (without the newline). */
int agent_connect_reply_parse(const char *line, char *err, size_t errlen)
{
	char *end, shown[41], safe[4 * sizeof(shown)];

	/* The peer's bytes go into err: at most 40 of them, made terminal-safe (no newline). */
	snprintf(shown, sizeof(shown), "%s", line);
	term_safe(shown, safe, sizeof(safe));
	if (strncmp(line, "OK ", 3) != 0)
		return errmsg(err, errlen, -ECONNREFUSED, "the guest agent is not listening (%s)",
			      line[0] ? safe : "connection closed");
	errno = 0;
	strtoul(line + 3, &end, 10);
	if (end == line + 3 || *end || errno)
		return errmsg(err, errlen, -EPROTO, "bad vsock handshake reply '%s'", safe);
	return 0;
}

int agent_state_dir(char *buf, size_t len)
{
	const char *d = getenv("COVE_RUN_DIR"), *rt = getenv("XDG_RUNTIME_DIR");
	int n;

	if (d && *d)
		n = snprintf(buf, len, "%s", d);
	else if (rt && *rt)
		n = snprintf(buf, len, "%s/cove", rt);
	else
		n = snprintf(buf, len, "/run/cove");
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* A path (has a '/') names the vsock socket itself; anything else is a name in the state dir. */
int agent_resolve(const char *sandbox, char *uds, size_t len, char *err, size_t errlen)
{
	char dir[AGENT_PATH_MAX];
	struct stat st;
	int n;

	if (!sandbox[0])
		return errmsg(err, errlen, -EINVAL, "empty sandbox name");
	if (strchr(sandbox, '/')) {
		n = snprintf(uds, len, "%s", sandbox);
	} else {
		if (strcmp(sandbox, ".") == 0 || strcmp(sandbox, "..") == 0)
			return errmsg(err, errlen, -EINVAL, "bad sandbox name '%s'", sandbox);
		if (agent_state_dir(dir, sizeof(dir)) < 0)
			return errmsg(err, errlen, -ENAMETOOLONG, "state directory path too long");
		n = snprintf(uds, len, "%s/%s/vsock.sock", dir, sandbox);
	}
	if (n < 0 || (size_t)n >= len || (size_t)n >= AGENT_PATH_MAX)
		return errmsg(err, errlen, -ENAMETOOLONG, "%s: socket path too long", sandbox);
	if (stat(uds, &st) < 0)
		return errmsg(err, errlen, -ENOENT, "no sandbox '%s' (%s: %s)", sandbox, uds,
			      strerror(errno));
	if (!S_ISSOCK(st.st_mode))
		return errmsg(err, errlen, -ENOTSOCK, "%s is not a socket", uds);
	return 0;
}

static int connect_once(const char *uds, int handshake_s, char *err, size_t errlen)
{
	struct timeval tv = {.tv_sec = handshake_s};
	char line[64];
	size_t n = 0;
	int fd = unix_connect(uds, 0, 0), ret;

	if (fd == -ENAMETOOLONG)
		return errmsg(err, errlen, fd, "%s: path too long", uds);
	if (fd < 0)
		return errmsg(err, errlen, fd, "%s: %s", uds, strerror(-fd));
	/* Only the handshake has a deadline: a session may be silent for hours. */
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	snprintf(line, sizeof(line), "CONNECT %d\n", AGENT_PORT);
	ret = wire_write_full(fd, line, strlen(line));
	while (ret == 0 && n < sizeof(line) - 1) {
		ret = wire_read_full(fd, line + n, 1);
		if (ret == 0 && line[n] == '\n')
			break;
		n += ret == 0;
	}
	line[n] = '\0';
	if (ret == -EAGAIN || ret == -EWOULDBLOCK) {
		close(fd);
		return errmsg(err, errlen, -ETIMEDOUT, "%s: no guest agent answered within %d s",
			      uds, handshake_s);
	}
	if (ret < 0 && ret != -ENODATA && ret != -ECONNRESET) {
		close(fd);
		return errmsg(err, errlen, ret, "%s: handshake: %s", uds, strerror(-ret));
	}
	ret = agent_connect_reply_parse(line, err, errlen);
	if (ret < 0) {
		close(fd);
		return ret;
	}
	tv.tv_sec = 0;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

static int connect_retry(const char *uds, double wait_s, int handshake_s, char *err, size_t errlen)
{
	double deadline = mono_s() + wait_s;

	for (;;) {
		int fd = connect_once(uds, handshake_s, err, errlen);

		/*
		 * A handshake that timed out is tried again too: a CONNECT that reaches a guest
		 * still handling its post-restore transport reset can be dropped unanswered.
		 */
		if (fd >= 0 || mono_s() >= deadline ||
		    (fd != -ECONNREFUSED && fd != -ENOENT && fd != -ECONNRESET &&
		     fd != -ETIMEDOUT)) {
			if (fd == -ETIMEDOUT && wait_s > handshake_s)
				errmsg(err, errlen, fd, "%s: no guest agent answered within %.0f s",
				       uds, wait_s);
			return fd;
		}
		usleep(20 * 1000);
	}
}

int agent_connect(const char *uds, double wait_s, char *err, size_t errlen)
{
	return connect_retry(uds, wait_s, 30, err, errlen);
}

static int call_with(const char *uds, double wait_s, int handshake_s, json_t *req, json_t **reply,
		     char *err, size_t errlen)
{
	int fd = connect_retry(uds, wait_s, handshake_s, err, errlen), ret;
	json_t *r = NULL;

	if (fd < 0)
		return fd;
	ret = wire_msg_write(fd, req);
	if (ret < 0) {
		errmsg(err, errlen, ret, "agent: send: %s", strerror(-ret));
		goto fail;
	}
	ret = wire_msg_read(fd, &r, err, errlen);
	if (ret < 0)
		goto fail;
	if (!json_is_true(json_object_get(r, "ok"))) {
		const char *e = json_string_value(json_object_get(r, "error"));
		char safe[1024];

		/* Every command prints this: the guest's text must not drive the terminal. */
		ret =
		    errmsg(err, errlen, -EREMOTEIO, "%s",
			   e ? term_safe(e, safe, sizeof(safe)) : "the agent refused the request");
		json_decref(r);
		goto fail;
	}
	*reply = r;
	return fd;
fail:
	close(fd);
	return ret;
}

int agent_call(const char *uds, double wait_s, json_t *req, json_t **reply, char *err,
	       size_t errlen)
{
	return call_with(uds, wait_s, 30, req, reply, err, errlen);
}

/* --- exec/attach streaming ------------------------------------------------------------------ */

static int send_winsize(int fd)
{
	struct winsize ws;
	uint8_t b[4];

	if (ioctl(0, TIOCGWINSZ, &ws) < 0)
		return 0;
	b[0] = (uint8_t)(ws.ws_row >> 8);
	b[1] = (uint8_t)ws.ws_row;
	b[2] = (uint8_t)(ws.ws_col >> 8);
	b[3] = (uint8_t)ws.ws_col;
	return wire_data_write(fd, WIRE_WINSZ, b, sizeof(b));
}

int agent_session_stream(int fd, bool tty, bool send_stdin, char *err, size_t errlen)
{
	struct termios saved;
	bool raw = false, out_ok = true, err_ok = true, in_open = send_stdin;
	sigset_t mask, old;
	uint8_t *buf = malloc(CHUNK > WIRE_DATA_MAX ? CHUNK : WIRE_DATA_MAX);
	int sfd, ret = -EPIPE;

	if (!buf)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	sigemptyset(&mask);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGHUP);
	sigaddset(&mask, SIGQUIT);
	sigaddset(&mask, SIGWINCH);
	sigaddset(&mask, SIGUSR1);
	sigaddset(&mask, SIGUSR2);
	sigprocmask(SIG_BLOCK, &mask, &old);
	sfd = signalfd(-1, &mask, SFD_CLOEXEC);
	if (tty && isatty(0) && tcgetattr(0, &saved) == 0) {
		struct termios t = saved;

		cfmakeraw(&t);
		raw = tcsetattr(0, TCSANOW, &t) == 0;
		send_winsize(fd);
	}
	for (;;) {
		struct pollfd p[3] = {{.fd = fd, .events = POLLIN},
				      {.fd = in_open ? 0 : -1, .events = POLLIN},
				      {.fd = sfd, .events = POLLIN}};
		uint8_t type;
		size_t len;

		if (poll(p, 3, -1) < 0) {
			if (errno == EINTR)
				continue;
			ret = errmsg(err, errlen, -errno, "poll: %s", strerror(errno));
			break;
		}
		if (p[2].revents) {
			struct signalfd_siginfo si;

			if (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
				if (si.ssi_signo == SIGWINCH) {
					if (tty)
						send_winsize(fd);
				} else {
					uint8_t b[4];

					b[0] = b[1] = b[2] = 0;
					b[3] = (uint8_t)si.ssi_signo;
					wire_data_write(fd, WIRE_SIGNAL, b, sizeof(b));
				}
			}
		}
		if (p[1].revents) {
			ssize_t n = read(0, buf, CHUNK);

			if (n < 0 && errno == EINTR)
				continue;
			if (n > 0) {
				wire_data_write(fd, WIRE_STDIN, buf, (size_t)n);
			} else {
				in_open = false;
				wire_data_write(fd, WIRE_CLOSE, NULL, 0);
			}
		}
		if (!p[0].revents)
			continue;
		ret = wire_data_read(fd, &type, buf, WIRE_DATA_MAX, &len);
		if (ret < 0) {
			ret = errmsg(err, errlen, ret == -EMSGSIZE ? -EMSGSIZE : -EPIPE,
				     ret == -EMSGSIZE ? "agent: data frame too large"
						      : "connection to the agent lost before the "
							"command ended");
			break;
		}
		if (type == WIRE_STDOUT && out_ok) {
			out_ok = wire_write_full(1, buf, len) == 0;
		} else if (type == WIRE_STDERR && err_ok) {
			err_ok = wire_write_full(2, buf, len) == 0;
		} else if (type == WIRE_EXIT) {
			int status;

			ret = agent_exit_parse((const char *)buf, len, &status);
			ret = ret < 0 ? errmsg(err, errlen, -EPROTO, "agent: bad exit frame")
				      : status;
			break;
		}
	}
	if (raw)
		tcsetattr(0, TCSANOW, &saved);
	if (sfd >= 0)
		close(sfd);
	sigprocmask(SIG_SETMASK, &old, NULL);
	free(buf);
	return ret;
}

/* --- identity ---------------------------------------------------------------------------- */

int agent_send_identity_as(const char *vsock_uds, uint64_t epoch, const char *token_hex,
			   struct agent_machine *m, double wait_s, char *err, size_t errlen)
{
	unsigned char seed[33]; /* a multiple of 3: base64 without padding */
	char seed64[45], void_hex[33];
	json_t *req, *reply = NULL;
	int fd;

	if (epoch > (uint64_t)INT64_MAX)
		return errmsg(err, errlen, -EINVAL, "identity: epoch out of range");
	if (!token_hex) {
		uint8_t tok[16];

		if (getrandom(tok, sizeof(tok), 0) != (ssize_t)sizeof(tok))
			return errmsg(err, errlen, -EIO, "no randomness for a token");
		hex_encode(tok, sizeof(tok), void_hex);
		explicit_bzero(tok, sizeof(tok));
		token_hex = void_hex;
		epoch = 0;
	}
	if (getrandom(seed, sizeof(seed), 0) != (ssize_t)sizeof(seed))
		return errmsg(err, errlen, -EIO, "identity: getrandom: %s", strerror(errno));
	b64_encode(seed, sizeof(seed), seed64);
	explicit_bzero(seed, sizeof(seed));
	req = json_pack("{s:s,s:I,s:s,s:s,s:I}", "op", "identity", "epoch", (json_int_t)epoch,
			"token", token_hex, "seed_b64", seed64, "time_ns",
			(json_int_t)realtime_ns());
	explicit_bzero(seed64, sizeof(seed64));
	explicit_bzero(void_hex, sizeof(void_hex));
	if (!req)
		return errmsg(err, errlen, -EINVAL, "identity: bad token");
	if (m && m->hostname)
		json_object_set_new(req, "hostname", json_string(m->hostname));
	if (m && m->machine_id)
		json_object_set_new(req, "machine_id", json_string(m->machine_id));
	/*
	 * A fork waits for this: an agent that is there answers at once, a guest without one
	 * (its vsock driver never came up) must not hold the fork for long.
	 */
	fd = call_with(vsock_uds, wait_s, AGENT_IDENTITY_HANDSHAKE_S, req, &reply, err, errlen);
	json_decref(req);
	if (fd < 0)
		return fd;
	if (m)
		m->new_machine = json_is_true(json_object_get(reply, "new_machine"));
	json_decref(reply);
	close(fd);
	return 0;
}

int agent_send_identity(const char *vsock_uds, uint64_t epoch, const char *token_hex, double wait_s,
			char *err, size_t errlen)
{
	return agent_send_identity_as(vsock_uds, epoch, token_hex, NULL, wait_s, err, errlen);
}

int agent_send_void_identity(const char *vsock_uds, double wait_s, char *err, size_t errlen)
{
	return agent_send_identity_as(vsock_uds, 0, NULL, NULL, wait_s, err, errlen);
}
