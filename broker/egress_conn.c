/* One egress connection, start to end: read and parse the proxy request head, check it
 * against the egress rules, resolve once and refuse private addresses unless the rule allows
 * them, connect to exactly the checked address, answer or forward, relay, audit one line. */
#include "egress.h"
#include "dest.h"
#include "egress_head.h"
#include "egress_mitm.h"
#include "egress_relay.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

struct egress_rec {
	const char *method, *host;
	int port;
	const char *decision; /* "allow" or "deny" */
	int rule;	      /* -1: none */
	const char *reason;
	int status; /* what the guest was answered; 0 = the upstream answers (plain HTTP) */
	char addr[INET6_ADDRSTRLEN];
	struct relay_stats st;
	int64_t t0;
};

static const char *status_text(int status)
{
	switch (status) {
	case 200:
		return "Connection established";
	case 400:
		return "Bad Request";
	case 403:
		return "Forbidden";
	case 408:
		return "Request Timeout";
	case 502:
		return "Bad Gateway";
	case 503:
		return "Service Unavailable";
	default:
		return "Error";
	}
}

/* Guest bytes in a reason go back to the guest and into the log: printable ASCII only. */
static void clean(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
			*s = '?';
}

/* Blocking sends with SO_SNDTIMEO set, never SIGPIPE. Returns 0 or -errno. */
static int send_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* A peer that stops reading must not hold a thread in send() for ever. */
static void send_timeout(int fd)
{
	struct timeval tv = {.tv_sec = EGRESS_HEAD_TIMEOUT_MS / 1000};

	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* A socket closed with unread bytes in it resets the peer, which may then lose the answer
 * still in flight: read what the guest still sends (a bit, briefly) until its end. */
static void linger_drain(int fd)
{
	int64_t deadline = broker_now_ns() + (int64_t)EGRESS_LINGER_MS * 1000000;
	size_t total = 0;
	char junk[4096];

	while (total < EGRESS_LINGER_BYTES) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		int64_t left = (deadline - broker_now_ns()) / 1000000;
		ssize_t n;

		if (left <= 0 || poll(&p, 1, (int)left) <= 0)
			return;
		n = recv(fd, junk, sizeof(junk), MSG_DONTWAIT);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (n <= 0)
			return;
		total += (size_t)n;
	}
}

static void reply_error(int fd, int status, const char *reason)
{
	char body[600], msg[900];
	int bl, n;

	bl = snprintf(body, sizeof(body), "cove-egress: %s%s\n", status == 403 ? "denied: " : "",
		      reason);
	if (bl < 0 || (size_t)bl >= sizeof(body))
		bl = (int)strlen(body);
	n = snprintf(msg, sizeof(msg),
		     "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
		     "Connection: close\r\n\r\n%s",
		     status, status_text(status), bl, body);
	if (n > 0 && (size_t)n < sizeof(msg))
		send_all(fd, msg, (size_t)n);
	shutdown(fd, SHUT_WR);
	linger_drain(fd);
}

static void audit_egress(struct broker *b, const struct egress_rec *e)
{
	json_t *o = json_object();
	int64_t ms = (broker_now_ns() - e->t0) / 1000000;
	int r = -ENOMEM;

	if (o && !json_object_set_new(o, "kind", json_string("egress")) &&
	    !json_object_set_new(o, "method", json_string(e->method ? e->method : "")) &&
	    !json_object_set_new(o, "host", json_string(e->host ? e->host : "")) &&
	    !json_object_set_new(o, "port", json_integer(e->port)) &&
	    !json_object_set_new(o, "addr", json_string(e->addr)) &&
	    !json_object_set_new(o, "decision", json_string(e->decision)) &&
	    !json_object_set_new(o, "rule", e->rule < 0 ? json_null() : json_integer(e->rule)) &&
	    !json_object_set_new(o, "reason", json_string(e->reason)) &&
	    !json_object_set_new(o, "status", json_integer(e->status)) &&
	    !json_object_set_new(o, "bytes_up", json_integer((json_int_t)e->st.up)) &&
	    !json_object_set_new(o, "bytes_down", json_integer((json_int_t)e->st.down)) &&
	    !json_object_set_new(o, "ms", json_integer(ms)))
		r = audit_append_fields(&b->audit, o);
	json_decref(o);
	if (r)
		broker_log(b, LOG_ERROR, "egress: audit write failed: %s", strerror(-r));
	broker_log(b, !strcmp(e->decision, "allow") ? LOG_DEBUG : LOG_INFO,
		   "egress %s %s port %d: %s, rule %d: %s (%llu up, %llu down)",
		   e->method ? e->method : "-", e->host ? e->host : "-", e->port, e->decision,
		   e->rule, e->reason, (unsigned long long)e->st.up,
		   (unsigned long long)e->st.down);
}

void egress_refuse(struct broker *b, int guest_fd, int status, const char *reason)
{
	struct egress_rec e = {.decision = "deny",
			       .rule = -1,
			       .reason = reason,
			       .status = status,
			       .t0 = broker_now_ns()};

	reply_error(guest_fd, status, reason);
	audit_egress(b, &e);
}

/* Reads until the head ends. Returns its length, 0 when the guest closed first, -E2BIG,
 * -ETIMEDOUT, -ECANCELED (stopping) or -errno. *got is what was read (head and beyond). */
static long read_head(int fd, int stop_fd, char *buf, size_t cap, size_t *got)
{
	int64_t deadline = broker_now_ns() + (int64_t)EGRESS_HEAD_TIMEOUT_MS * 1000000;

	*got = 0;
	for (;;) {
		struct pollfd p[2] = {{.fd = fd, .events = POLLIN},
				      {.fd = stop_fd, .events = POLLIN}};
		int64_t left = (deadline - broker_now_ns()) / 1000000;
		long end;
		ssize_t n;

		if (left <= 0)
			return -ETIMEDOUT;
		n = poll(p, 2, (int)left);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (p[1].revents)
			return -ECANCELED;
		if (!n)
			continue;
		n = recv(fd, buf + *got, cap - *got, MSG_DONTWAIT);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return 0;
		*got += (size_t)n;
		end = egress_head_end(buf, *got);
		if (end)
			return end;
	}
}

/* Resolves, checks and connects. Returns the upstream socket, or -1 with e (status, reason)
 * set for the guest. */
static int open_upstream(struct broker *b, const struct egress_head *h,
			 const struct egress_rule *rule, int stop_fd, struct egress_rec *e,
			 char *why, size_t whylen)
{
	struct dest_addrs d;
	size_t used = 0;
	int r, fd;

	r = dest_lookup(h->host, h->port, rule->allow_private, &d);
	if (r == -EACCES) {
		e->status = 403;
		snprintf(why, whylen,
			 "%s resolves to a private, loopback or link-local address (egress rule "
			 "%d has no allow_private)",
			 h->host, e->rule);
		return -1;
	}
	if (r) {
		e->status = 502;
		snprintf(why, whylen, "cannot resolve %s", h->host);
		return -1;
	}
	fd = dest_connect(&d, rule->allow_private, EGRESS_CONNECT_TIMEOUT_MS, stop_fd, &used);
	if (fd >= 0)
		send_timeout(fd);
	if (fd < 0) {
		e->status = 502;
		snprintf(why, whylen, "upstream: connect to %s port %d failed: %s", h->host,
			 h->port, strerror(-fd));
		return -1;
	}
	{
		const struct sockaddr *sa = (const struct sockaddr *)&d.a[used];
		const void *src = sa->sa_family == AF_INET
				      ? (const void *)&((const struct sockaddr_in *)sa)->sin_addr
				      : (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr;

		inet_ntop(sa->sa_family, src, e->addr, sizeof(e->addr));
	}
	(void)b;
	return fd;
}

void egress_serve(struct broker *b, int gfd, int stop_fd)
{
	const struct egress_policy *pol = &b->pol.egress;
	struct egress_rec e = {.decision = "deny", .rule = -1, .t0 = broker_now_ns()};
	struct egress_head h = {0};
	char why[512] = "", *buf = malloc(EGRESS_HEAD_MAX);
	size_t got = 0;
	long end;
	int ufd = -1;

	if (!buf) {
		egress_refuse(b, gfd, 503, "out of memory");
		return;
	}
	send_timeout(gfd);
	end = read_head(gfd, stop_fd, buf, EGRESS_HEAD_MAX, &got);
	if (end <= 0) {
		e.reason = end == 0	       ? "closed before a request"
			   : end == -E2BIG     ? "request head over 16384 bytes"
			   : end == -ETIMEDOUT ? "no request head within 10 s"
			   : end == -ECANCELED ? "broker stopping"
					       : "read failed";
		e.status = end == -E2BIG ? 400 : end == -ETIMEDOUT ? 408 : 0;
		if (e.status)
			reply_error(gfd, e.status, e.reason);
		goto out;
	}
	if (egress_head_parse(buf, (size_t)end, &h, why, sizeof(why))) {
		clean(why);
		e.method = h.method[0] ? h.method : NULL;
		e.host = h.host[0] ? h.host : NULL;
		e.port = h.port;
		e.status = 400;
		e.reason = why;
		reply_error(gfd, 400, why);
		goto out;
	}
	e.method = h.method;
	e.host = h.host;
	e.port = h.port;
	/* A host a credential names: the broker ends the guest's TLS and injects (egress_mitm.c).
	 * The guest waits for the "200" before its TLS hello; early bytes are refused. */
	if (h.is_connect && egress_mitm_wanted(b, h.host, h.port)) {
		if (got > (size_t)end) {
			e.status = 400;
			e.reason = "data before the tunnel opened";
			reply_error(gfd, 400, e.reason);
			goto out;
		}
		free(buf);
		buf = NULL;
		if (egress_mitm_serve(b, gfd, stop_fd, h.host, h.port, &e.status, e.addr,
				      sizeof(e.addr), why, sizeof(why)) &&
		    e.status != 200) {
			e.reason = why;
			reply_error(gfd, e.status, why);
			goto out;
		}
		e.reason = why;
		goto allowed;
	}
	e.rule = egress_match(pol, h.host, h.port, h.method, why, sizeof(why));
	if (e.rule < 0) {
		e.status = 403;
		e.reason = why;
		reply_error(gfd, 403, why);
		goto out;
	}
	ufd = open_upstream(b, &h, &pol->rules[e.rule], stop_fd, &e, why, sizeof(why));
	if (ufd < 0) {
		e.reason = why;
		reply_error(gfd, e.status, why);
		goto out;
	}
	/* Allowed and connected: the tunnel opens, or the rewritten request goes out. Bytes the
	 * guest sent after the head (a TLS hello, a body) follow it. */
	if (h.is_connect) {
		static const char ok[] = "HTTP/1.1 200 Connection established\r\n\r\n";

		e.status = 200;
		if (send_all(gfd, ok, sizeof(ok) - 1)) {
			e.reason = "guest went away";
			goto allowed;
		}
	} else if (send_all(ufd, h.fwd, h.fwd_len)) {
		e.status = 502;
		snprintf(why, sizeof(why), "upstream: sending the request failed");
		e.reason = why;
		reply_error(gfd, 502, why);
		goto allowed;
	}
	if (got > (size_t)end) {
		if ((uint64_t)(got - (size_t)end) > pol->max_bytes) {
			e.reason = "over max_bytes";
			goto allowed;
		}
		if (send_all(ufd, buf + end, got - (size_t)end)) {
			e.reason = "upstream reset";
			goto allowed;
		}
		e.st.up = got - (size_t)end;
	}
	free(buf);
	buf = NULL;
	e.reason =
	    egress_relay(gfd, ufd, stop_fd, (int)pol->idle_timeout_s * 1000, pol->max_bytes, &e.st);
allowed:
	e.decision = "allow";
out:
	audit_egress(b, &e);
	if (ufd >= 0)
		close(ufd);
	egress_head_free(&h);
	free(buf);
}
