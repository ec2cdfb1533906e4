/* The key relay process and its client: a key provider run on the host for a jailed VMM. */
#include "snapshot/keyprov_relay.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/errmsg.h"
#include "snapshot/crypto.h"

#define RELAY_ERR_MAX 256u

struct relay_req {
	uint8_t wrap;
	uint8_t type;
	uint16_t config_len;
	uint32_t in_len;
	/* then config_len bytes of config, in_len bytes of input */
};

struct relay_rep {
	int32_t r;
	uint32_t out_len;
	uint32_t err_len;
	/* then out_len bytes of output, err_len bytes of one error line */
};

#define RELAY_REQ_MAX (sizeof(struct relay_req) + KEYPROV_CONFIG_MAX + KEYPROV_WRAPPED_MAX)
#define RELAY_REP_MAX (sizeof(struct relay_rep) + KEYPROV_WRAPPED_MAX + RELAY_ERR_MAX)

static ssize_t recv_msg(int sock, uint8_t *buf, size_t cap)
{
	struct iovec iov = {buf, cap};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	ssize_t n;
	do
		n = recvmsg(sock, &mh, 0);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	return mh.msg_flags & MSG_TRUNC ? -EMSGSIZE : n;
}

static int send_msg(int sock, const uint8_t *buf, size_t len)
{
	ssize_t n;
	do
		n = send(sock, buf, len, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	return (size_t)n == len ? 0 : -EIO;
}

/* One request, checked against the relay's own provider, run; the answer into rep. */
static size_t serve_one(struct keyprov *kp, const uint8_t *buf, ssize_t n, uint8_t *rep)
{
	struct relay_rep h = {0, 0, 0};
	uint8_t *out = rep + sizeof(h);
	char *err = (char *)out + KEYPROV_WRAPPED_MAX;
	err[0] = '\0';
	struct relay_req q;
	size_t out_len = 0;
	if (n < 0) {
		h.r = errmsg(err, RELAY_ERR_MAX, (int)n, "key relay: request over %zu bytes",
			     RELAY_REQ_MAX);
		goto done;
	}
	memcpy(&q, buf, (size_t)n < sizeof(q) ? (size_t)n : sizeof(q));
	const char *config = (const char *)buf + sizeof(q);
	if ((size_t)n < sizeof(q) || q.config_len > KEYPROV_CONFIG_MAX ||
	    q.in_len > KEYPROV_WRAPPED_MAX || q.wrap > 1 ||
	    (size_t)n != sizeof(q) + q.config_len + q.in_len) {
		h.r = errmsg(err, RELAY_ERR_MAX, -EPROTO, "key relay: malformed request");
		goto done;
	}
	/* The provider is the host's, fixed when the relay started: nothing else runs here. */
	const char *mine = keyprov_config(kp);
	if (q.type != (uint8_t)keyprov_get_type(kp) || q.config_len != strlen(mine) ||
	    memcmp(config, mine, q.config_len)) {
		h.r = errmsg(err, RELAY_ERR_MAX, -EPERM,
			     "key relay: a provider other than the host's was asked for");
		goto done;
	}
	h.r = keyprov_run(kp, q.wrap, (const uint8_t *)config + q.config_len, q.in_len, out,
			  KEYPROV_WRAPPED_MAX, &out_len, err, RELAY_ERR_MAX);
	if (h.r)
		out_len = 0;
done:
	h.out_len = (uint32_t)out_len;
	h.err_len = h.r ? (uint32_t)strnlen(err, RELAY_ERR_MAX - 1) : 0;
	memmove(out + out_len, err, h.err_len);
	memcpy(rep, &h, sizeof(h));
	return sizeof(h) + out_len + h.err_len;
}

static void serve(int sock, struct keyprov *kp)
{
	prctl(PR_SET_NAME, "cove-keyrelay", 0, 0, 0);
	uint8_t *buf = malloc(RELAY_REQ_MAX);
	uint8_t *rep = malloc(RELAY_REP_MAX);
	if (!buf || !rep)
		_exit(1);
	for (;;) {
		ssize_t n = recv_msg(sock, buf, RELAY_REQ_MAX);
		if (n == 0 || (n < 0 && n != -EMSGSIZE))
			_exit(0); /* the VMM is gone */
		size_t len = serve_one(kp, buf, n, rep);
		crypto_cleanse(buf, RELAY_REQ_MAX);
		int r = send_msg(sock, rep, len);
		crypto_cleanse(rep, RELAY_REP_MAX);
		if (r)
			_exit(0);
	}
}

int keyrelay_start(struct keyrelay *kr, const char *spec, char *err, size_t errlen)
{
	kr->sock = kr->pid = -1;
	struct keyprov *kp = NULL;
	int r = keyprov_new_spec(spec, &kp, err, errlen);
	if (r)
		return r;
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
		r = errmsg(err, errlen, -errno, "key relay: socketpair: %s", strerror(errno));
		keyprov_free(kp);
		return r;
	}
	pid_t pid = fork();
	if (pid < 0) {
		r = errmsg(err, errlen, -errno, "key relay: fork: %s", strerror(errno));
		close(sv[0]);
		close(sv[1]);
		keyprov_free(kp);
		return r;
	}
	if (pid == 0) {
		/* Nothing of the VMM but stdio and the socket (fd 3). */
		close(sv[0]);
		if (sv[1] != 3 && dup3(sv[1], 3, O_CLOEXEC) < 0)
			_exit(1);
		syscall(SYS_close_range, 4, ~0U, 0);
		serve(3, kp);
		_exit(0);
	}
	close(sv[1]);
	keyprov_free(kp);
	if (sv[0] < 3) { /* never mistaken for "no relay" (0) or stdio */
		int hi = fcntl(sv[0], F_DUPFD_CLOEXEC, 3);
		close(sv[0]);
		sv[0] = hi;
		if (hi < 0)
			return errmsg(err, errlen, -errno, "key relay: %s", strerror(errno));
	}
	kr->sock = sv[0];
	kr->pid = (int)pid;
	return 0;
}

void keyrelay_stop(struct keyrelay *kr)
{
	if (kr->sock >= 0)
		close(kr->sock);
	if (kr->pid > 0)
		while (waitpid(kr->pid, NULL, 0) < 0 && errno == EINTR)
			;
	kr->sock = kr->pid = -1;
}

int keyrelay_call(int sock, enum keyprov_type type, const char *config, int wrap, const uint8_t *in,
		  size_t in_len, uint8_t *out, size_t cap, size_t *out_len, char *err,
		  size_t errlen)
{
	size_t clen = strlen(config);
	if (clen > KEYPROV_CONFIG_MAX || in_len > KEYPROV_WRAPPED_MAX)
		return errmsg(err, errlen, -EMSGSIZE, "key relay: request too large");
	uint8_t *buf = malloc(RELAY_REQ_MAX > RELAY_REP_MAX ? RELAY_REQ_MAX : RELAY_REP_MAX);
	if (!buf)
		return errmsg(err, errlen, -ENOMEM, "key relay: out of memory");
	struct relay_req q = {(uint8_t) !!wrap, (uint8_t)type, (uint16_t)clen, (uint32_t)in_len};
	memcpy(buf, &q, sizeof(q));
	memcpy(buf + sizeof(q), config, clen);
	memcpy(buf + sizeof(q) + clen, in, in_len);
	int r = send_msg(sock, buf, sizeof(q) + clen + in_len);
	crypto_cleanse(buf, sizeof(q) + clen + in_len);
	ssize_t n = r ? r : recv_msg(sock, buf, RELAY_REP_MAX);
	struct relay_rep h;
	if (n <= 0) {
		r = errmsg(err, errlen, n ? (int)n : -ECONNRESET, "key relay: %s",
			   n ? strerror((int)-n) : "the relay process is gone");
		goto out;
	}
	memcpy(&h, buf, (size_t)n < sizeof(h) ? (size_t)n : sizeof(h));
	if ((size_t)n < sizeof(h) || h.out_len > KEYPROV_WRAPPED_MAX ||
	    h.err_len >= RELAY_ERR_MAX || (size_t)n != sizeof(h) + h.out_len + h.err_len ||
	    h.r > 0 || (h.r && h.out_len)) {
		r = errmsg(err, errlen, -EPROTO, "key relay: malformed answer");
		goto out;
	}
	if (h.r) {
		r = errmsg(err, errlen, h.r, "%.*s", (int)h.err_len,
			   (const char *)buf + sizeof(h) + h.out_len);
		goto out;
	}
	if (h.out_len > cap) {
		r = errmsg(err, errlen, -EMSGSIZE, "key relay: answer larger than %zu bytes", cap);
		goto out;
	}
	memcpy(out, buf + sizeof(h), h.out_len);
	*out_len = h.out_len;
	r = 0;
out:
	crypto_cleanse(buf, RELAY_REQ_MAX > RELAY_REP_MAX ? RELAY_REQ_MAX : RELAY_REP_MAX);
	free(buf);
	return r;
}
