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

/* Reads until the head ends; buf already holds *got bytes (what followed the last request).
 * Returns its length, 0 when the guest closed first, -E2BIG, -ETIMEDOUT, -ECANCELED (stopping)
 * or -errno. *got is what was read (head and beyond). */
static long read_head(int fd, int stop_fd, char *buf, size_t cap, size_t *got, int timeout_ms)
{
	int64_t deadline = broker_now_ns() + (int64_t)timeout_ms * 1000000;
	long end = egress_head_end(buf, *got);

	if (end)
		return end;
	for (;;) {
		struct pollfd p[2] = {{.fd = fd, .events = POLLIN},
				      {.fd = stop_fd, .events = POLLIN}};
		int64_t left = (deadline - broker_now_ns()) / 1000000;
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

/* Plain HTTP keeps the guest's connection open across requests, and an upstream may read on
 * after "Connection: close". So every request head on the connection is checked against the
 * rules and gets an upstream connection of its own; the broker reads the guest's next request
 * only after this one's body and answer ended, and passes on nothing beyond either end. */
struct plain {
	struct broker *b;
	int gfd, stop_fd;
	char *buf; /* guest bytes read and not used yet: the next head and what follows */
	size_t got;
	uint64_t up, down; /* the connection's totals, for max_bytes */
};

/* Sends the guest bytes buffered in c (at most what the request's body framing covers) on to
 * the upstream. Returns NULL to go on, or why the exchange ends. */
static const char *pump_body(struct plain *c, struct egress_body *bd, int ufd, char *out,
			     size_t outcap, struct relay_stats *st)
{
	const struct egress_policy *pol = &c->b->pol.egress;

	while (!bd->done && c->got) {
		size_t olen;
		long used = egress_body_feed(bd, c->buf, c->got, out, outcap, &olen);

		if (used < 0)
			return "bad request body";
		if ((uint64_t)used > pol->max_bytes - c->up)
			return "over max_bytes";
		if (olen && send_all(ufd, out, olen))
			return "upstream reset";
		c->up += (uint64_t)used;
		st->up += (uint64_t)used;
		memmove(c->buf, c->buf + used, c->got - (size_t)used);
		c->got -= (size_t)used;
	}
	return NULL;
}

/* One request's body up and its answer down. *more: the guest's connection can carry the next
 * request (both ended where their framing says). Returns how the exchange ended. */
static const char *exchange(struct plain *c, int ufd, struct egress_body *bd, bool head_req,
			    struct relay_stats *st, bool *more)
{
	const struct egress_policy *pol = &c->b->pol.egress;
	struct egress_resp *rp = malloc(sizeof(*rp));
	char *out = malloc(EGRESS_BODY_OUT(EGRESS_BODY_IN)), *down = malloc(EGRESS_RELAY_BUF);
	const char *why = NULL;

	*more = false;
	if (!rp || !out || !down) {
		why = "out of memory";
		goto out;
	}
	egress_resp_init(rp, head_req);
	why = pump_body(c, bd, ufd, out, EGRESS_BODY_OUT(EGRESS_BODY_IN), st);
	while (!why && !rp->final) {
		struct pollfd p[3] = {{.fd = c->gfd, .events = POLLIN},
				      {.fd = ufd, .events = POLLIN},
				      {.fd = c->stop_fd, .events = POLLIN}};
		ssize_t n;
		long used;

		/* Once the body ended the guest's next bytes wait in the socket until the answer
		 * is over: they are the next request. */
		if (bd->done || c->got == EGRESS_HEAD_MAX)
			p[0].fd = -1;
		n = poll(p, 3, (int)pol->idle_timeout_s * 1000);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			why = "poll failed";
			break;
		}
		if (n == 0) {
			why = "idle timeout";
			break;
		}
		if (p[2].revents) {
			why = "broker stopping";
			break;
		}
		if (p[0].revents) {
			size_t room = EGRESS_HEAD_MAX - c->got;

			n = recv(c->gfd, c->buf + c->got,
				 room < EGRESS_BODY_IN ? room : EGRESS_BODY_IN, MSG_DONTWAIT);
			if (n < 0 && errno != EAGAIN && errno != EINTR) {
				why = "guest reset";
				break;
			}
			if (n == 0) {
				why = "guest went away"; /* before its body ended */
				break;
			}
			if (n > 0) {
				c->got += (size_t)n;
				why =
				    pump_body(c, bd, ufd, out, EGRESS_BODY_OUT(EGRESS_BODY_IN), st);
			}
			if (why)
				break;
		}
		if (!p[1].revents)
			continue;
		n = recv(ufd, down, EGRESS_RELAY_BUF, MSG_DONTWAIT);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (n < 0) {
			/* The audit reason is one word; the log says what the kernel said. */
			broker_log(c->b, LOG_WARN, "egress: upstream read after %llu bytes: %s",
				   (unsigned long long)st->down, strerror(errno));
			why = "upstream reset";
			break;
		}
		used = egress_resp_feed(rp, down, (size_t)n);
		if (n == 0) {
			why = used < 0 ? "upstream closed before its answer ended" : NULL;
			break;
		}
		if (used < 0) {
			/* Not HTTP the proxy can frame: the guest gets what came, then the end. */
			send_all(c->gfd, down, (size_t)n);
			why = "upstream answer not HTTP/1.x";
			break;
		}
		if ((uint64_t)used > pol->max_bytes - c->down) {
			why = "over max_bytes";
			break;
		}
		if (send_all(c->gfd, down, (size_t)used)) {
			why = "guest went away";
			break;
		}
		c->down += (uint64_t)used;
		st->down += (uint64_t)used;
	}
	if (!why && !bd->done)
		why = "answered before the request body ended";
	/* An answer that ended at the upstream's close tells the guest so only by the close; and
	 * when the guest's request or the answer says the connection closes, the guest expects
	 * that close (the answer goes to the guest as it came, its Connection header too). */
	*more = !why && !rp->at_eof && rp->status != 101 && http_should_keep_alive(&rp->p) &&
		http_should_keep_alive(&bd->p);
out:
	free(rp);
	free(out);
	free(down);
	return why ? why : "closed";
}

/* Serves the plain-HTTP requests of a connection whose first head (buf[0..end), got bytes read)
 * parsed into *h. Audits one record per request. */
static void serve_plain(struct broker *b, int gfd, int stop_fd, char *buf, size_t got, long end,
			struct egress_head *h, int64_t t0)
{
	const struct egress_policy *pol = &b->pol.egress;
	struct plain c = {.b = b, .gfd = gfd, .stop_fd = stop_fd, .buf = buf, .got = got};
	char why[512];
	bool first = true;

	for (;;) {
		struct egress_rec e = {.decision = "deny",
				       .rule = -1,
				       .t0 = first ? t0 : broker_now_ns(),
				       .method = h->method,
				       .host = h->host,
				       .port = h->port};
		struct egress_body bd;
		bool more = false;
		int ufd;

		if (h->is_connect) { /* only after a plain request: CONNECT opens its own */
			e.status = 400;
			e.reason = "CONNECT after a request on the same connection";
			reply_error(gfd, 400, e.reason);
			audit_egress(b, &e);
			return;
		}
		e.rule = egress_match(pol, h->host, h->port, h->method, why, sizeof(why));
		if (e.rule < 0) {
			e.status = 403;
			e.reason = why;
			reply_error(gfd, 403, why);
			audit_egress(b, &e);
			return;
		}
		if (egress_body_init(&bd, c.buf, (size_t)end)) {
			e.status = 400;
			e.reason = "bad request framing";
			reply_error(gfd, 400, e.reason);
			audit_egress(b, &e);
			return;
		}
		ufd = open_upstream(b, h, &pol->rules[e.rule], stop_fd, &e, why, sizeof(why));
		if (ufd < 0) {
			e.reason = why;
			reply_error(gfd, e.status, why);
			audit_egress(b, &e);
			return;
		}
		e.decision = "allow";
		memmove(c.buf, c.buf + end, c.got - (size_t)end);
		c.got -= (size_t)end;
		if (send_all(ufd, h->fwd, h->fwd_len)) {
			e.status = 502;
			snprintf(why, sizeof(why), "upstream: sending the request failed");
			e.reason = why;
			reply_error(gfd, 502, why);
		} else {
			e.reason = exchange(&c, ufd, &bd, !strcmp(h->method, "HEAD"), &e.st, &more);
		}
		close(ufd);
		audit_egress(b, &e);
		if (!more)
			return;
		first = false;
		egress_head_free(h);
		/* The next request: as long as the connection may stay idle. */
		end = read_head(gfd, stop_fd, c.buf, EGRESS_HEAD_MAX, &c.got,
				(int)pol->idle_timeout_s * 1000);
		if (end == -E2BIG) {
			struct egress_rec r = {.decision = "deny",
					       .rule = -1,
					       .t0 = broker_now_ns(),
					       .status = 400,
					       .reason = "request head over 16384 bytes"};

			reply_error(gfd, 400, r.reason);
			audit_egress(b, &r);
		}
		if (end <= 0)
			return; /* closed, idle or stopping between requests: nothing to answer */
		if (egress_head_parse(c.buf, (size_t)end, h, why, sizeof(why))) {
			struct egress_rec r = {.decision = "deny",
					       .rule = -1,
					       .t0 = broker_now_ns(),
					       .method = h->method[0] ? h->method : NULL,
					       .host = h->host[0] ? h->host : NULL,
					       .port = h->port,
					       .status = 400,
					       .reason = why};

			clean(why);
			reply_error(gfd, 400, why);
			audit_egress(b, &r);
			return;
		}
	}
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
	end = read_head(gfd, stop_fd, buf, EGRESS_HEAD_MAX, &got, EGRESS_HEAD_TIMEOUT_MS);
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
	if (!h.is_connect) {
		serve_plain(b, gfd, stop_fd, buf, got, end, &h, e.t0);
		goto done;
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
	/* Allowed and connected: the tunnel opens. Bytes the guest sent after the head (a TLS
	 * hello) follow it. */
	{
		static const char ok[] = "HTTP/1.1 200 Connection established\r\n\r\n";

		e.status = 200;
		if (send_all(gfd, ok, sizeof(ok) - 1)) {
			e.reason = "guest went away";
			goto allowed;
		}
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
done:
	if (ufd >= 0)
		close(ufd);
	egress_head_free(&h);
	free(buf);
}
