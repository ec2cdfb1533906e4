/*
 * Client side of the control API: one HTTP/1.1 request over the sandbox's Unix socket, the reply
 * parsed by http-parser (the same library the API server uses). The request is ours and simple
 * (a method, a path, an optional JSON body, Connection: close); the reply comes from a VMM that a
 * guest may have broken into, so it is parsed by the library, capped and timed out.
 * No libcurl: it and what it links (about 27 libraries) cost a process ~60 ms to load in the KVM
 * box.
 */
#include "cli/api_client.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <http_parser.h>
#include <jansson.h>

#include "common/clock.h"
#include "common/errmsg.h"
#include "common/fd_io.h"
#include "common/unix_sock.h"

#define REPLY_MAX	 (1u << 20)
#define REQUEST_HEAD_MAX 1024

struct reply {
	char *body;
	size_t len;
	bool too_big, done;
};

static int on_body(http_parser *hp, const char *at, size_t n)
{
	struct reply *r = hp->data;
	if (r->len + n > REPLY_MAX) {
		r->too_big = true;
		return 1;
	}
	char *p = realloc(r->body, r->len + n + 1);
	if (!p)
		return 1;
	memcpy(p + r->len, at, n);
	r->body = p;
	r->len += n;
	p[r->len] = 0;
	return 0;
}

static int on_done(http_parser *hp)
{
	struct reply *r = hp->data;
	r->done = true;
	return 0;
}

static int send_request(int fd, const char *method, const char *path, const char *body)
{
	char head[REQUEST_HEAD_MAX];
	size_t blen = body ? strlen(body) : 0;
	int n = snprintf(head, sizeof(head),
			 "%s %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
			 "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
			 method, path, blen);
	if (n < 0 || (size_t)n >= sizeof(head))
		return -ENAMETOOLONG;
	int r = write_full(fd, head, (size_t)n);
	if (!r && blen)
		r = write_full(fd, body, blen);
	return r;
}

/* Reads and parses the reply until it is complete, the peer closes, or the deadline passes. */
static int read_reply(int fd, http_parser *hp, struct reply *rep, double deadline, char *why,
		      size_t whylen)
{
	http_parser_settings cb;
	char buf[4096];

	http_parser_settings_init(&cb);
	cb.on_body = on_body;
	cb.on_message_complete = on_done;
	while (!rep->done) {
		double left = deadline - mono_s();
		if (left <= 0)
			return errmsg(why, whylen, -ETIMEDOUT, "no reply in time");
		struct pollfd p = {.fd = fd, .events = POLLIN};
		int pr = poll(&p, 1, (int)(left * 1000) + 1);
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr < 0)
			return errmsg(why, whylen, -errno, "poll: %s", strerror(errno));
		if (pr == 0)
			continue;
		ssize_t n = read(fd, buf, sizeof(buf));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errmsg(why, whylen, -errno, "%s", strerror(errno));
		/* n == 0 tells the parser the peer closed: a reply without a length ends there. */
		size_t used = http_parser_execute(hp, &cb, buf, (size_t)n);
		if (rep->too_big)
			return errmsg(why, whylen, -EMSGSIZE, "reply too large");
		if (HTTP_PARSER_ERRNO(hp) != HPE_OK || used != (size_t)n)
			return errmsg(why, whylen, -EPROTO, "bad reply (%s)",
				      http_errno_description(HTTP_PARSER_ERRNO(hp)));
		if (n == 0 && !rep->done)
			return errmsg(why, whylen, -ECONNRESET,
				      "connection closed before the reply");
	}
	return 0;
}

int api_call(const char *sock, const char *method, const char *path, const char *body,
	     long timeout_s, long *status, char **reply, char *err, size_t errlen)
{
	double deadline = mono_s() + (double)(timeout_s > 0 ? timeout_s : 30);
	struct reply rep = {0};
	http_parser hp;
	char why[160];
	int r;

	*reply = NULL;
	*status = 0;
	int fd = unix_connect(sock, 0, (double)(timeout_s > 0 ? timeout_s : 30));
	if (fd < 0)
		return errmsg(err, errlen, fd == -ETIMEDOUT ? fd : -ECONNREFUSED, "%s %s on %s: %s",
			      method, path, sock, strerror(-fd));
	r = send_request(fd, method, path, body);
	if (r) {
		errmsg(why, sizeof(why), r, "cannot send the request: %s", strerror(-r));
	} else {
		http_parser_init(&hp, HTTP_RESPONSE);
		hp.data = &rep;
		r = read_reply(fd, &hp, &rep, deadline, why, sizeof(why));
	}
	close(fd);
	if (r) {
		free(rep.body);
		return errmsg(err, errlen, r == -ETIMEDOUT ? r : -ECONNREFUSED, "%s %s on %s: %s",
			      method, path, sock, why);
	}
	*status = hp.status_code;
	*reply = rep.body ? rep.body : strdup("");
	return *reply ? 0 : errmsg(err, errlen, -ENOMEM, "out of memory");
}

void api_fault_text(const char *reply, char *out, size_t cap)
{
	json_t *j = json_loads(reply ? reply : "", 0, NULL);
	const char *m = json_string_value(json_object_get(j, "fault_message"));
	snprintf(out, cap, "%s", m ? m : reply ? reply : "");
	json_decref(j);
}
