/*
 * Control API transport: HTTP/1.1 on a Unix socket, parsed by http-parser (no TLS, depends on
 * libc only) and served from the event loop thread. Connections live in an epoll set of their
 * own, one handler in the loop; every read is bounded, so a flooding client cannot hold the loop.
 */
#include "common/hex.h"
#include "sandbox/api.h"
#include "vmm/evloop.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <http_parser.h>
#include <jansson.h>

/* Same cap as api_handle's, enforced here before the body is read. */
#define API_HTTP_MAX_URL	 256
#define API_HTTP_MAX_CONNECTIONS 16
#define API_HTTP_IDLE_TIMEOUT_MS 10000
/* Request line and headers: at most this many bytes and header lines (then 431). */
#define API_HTTP_MAX_HEAD    ((size_t)32 * 1024)
#define API_HTTP_MAX_HEADERS 64
/* An oversized chunked body is read and dropped up to here, then the connection is cut. */
#define API_HTTP_MAX_DISCARD ((size_t)1024 * 1024)
/* One read per ready connection per loop round: the loop stays fair to everything else. */
#define API_HTTP_READ_CHUNK 4096
#define API_HTTP_IN_CAP	    ((size_t)16 * 1024)
#define API_HTTP_EVENTS	    16

struct api_conn {
	struct api_server *srv;
	int fd;
	http_parser parser;
	uint64_t last_ms; /* last activity, for the idle timeout */
	/* The request being read; one byte past the cap shows api_handle a path too long. */
	char url[API_HTTP_MAX_URL + 2];
	size_t url_len;
	size_t head_bytes;
	unsigned nr_headers;
	char field[16]; /* the current header's name, enough to know "Expect" */
	size_t field_len;
	bool field_done;
	bool in_expect; /* in the value of an Expect header */
	bool expect_continue;
	bool url_too_long;
	char *body;
	size_t body_len, body_cap;
	size_t discarded; /* bytes of an oversized chunked body, counted for the 413 message */
	bool oversized;	  /* body exceeded API_MAX_BODY; the rest is counted, not kept */
	bool complete;	  /* a whole request is parsed (the parser is paused) */
	int refuse;	  /* an HTTP status to answer with before the body, then close */
	/* Unparsed bytes (a pipelined request waits here while a response is written). */
	char in[API_HTTP_IN_CAP];
	size_t in_len;
	/* The response being written. */
	char *out;
	size_t out_len, out_off;
	bool close_after; /* close once the response is out */
	/*
	 * Closing with unread input would reset the connection, and the client could lose the
	 * answer: after it, the write side is shut and input is read and dropped (up to
	 * API_HTTP_MAX_DISCARD, or the idle timeout) until the client closes.
	 */
	bool draining;
	size_t drained;
};

struct api_server {
	struct api_backend be; /* copied so callers may build it on the stack */
	struct evloop *loop;
	int listen_fd;
	int epfd; /* the connections and the listen socket; itself one handler in the loop */
	int timer_fd;
	struct api_conn *conns[API_HTTP_MAX_CONNECTIONS];
	dev_t sock_dev; /* identify our socket file so stop never unlinks a successor's */
	ino_t sock_ino;
	char *sock_path;
	http_parser_settings settings;
};

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static const char *reason(int status)
{
	switch (status) {
	case 100:
		return "Continue";
	case 200:
		return "OK";
	case 204:
		return "No Content";
	case 400:
		return "Bad Request";
	case 404:
		return "Not Found";
	case 405:
		return "Method Not Allowed";
	case 408:
		return "Request Timeout";
	case 409:
		return "Conflict";
	case 413:
		return "Content Too Large";
	case 414:
		return "URI Too Long";
	case 431:
		return "Request Header Fields Too Large";
	case 500:
		return "Internal Server Error";
	case 501:
		return "Not Implemented";
	case 503:
		return "Service Unavailable";
	case 505:
		return "HTTP Version Not Supported";
	default:
		return "Status";
	}
}

/* A transport-level fault in the handler's shape: {"fault_message": msg}. */
static void fault_response(struct api_response *resp, int status, const char *msg)
{
	json_t *j = json_pack("{s:s}", "fault_message", msg);

	resp->status = status;
	resp->body = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
}

static void conn_reset_request(struct api_conn *c)
{
	c->url_len = 0;
	c->url[0] = '\0';
	c->head_bytes = 0;
	c->nr_headers = 0;
	c->field_len = 0;
	c->field_done = false;
	c->in_expect = c->expect_continue = c->url_too_long = false;
	free(c->body);
	c->body = NULL;
	c->body_len = c->body_cap = 0;
	c->discarded = 0;
	c->oversized = c->complete = false;
	c->refuse = 0;
}

static void update_events(struct api_conn *c)
{
	struct epoll_event ev = {.data.ptr = c};

	/* Read only while no response is waiting: a client gets its answers in order. */
	ev.events = c->out ? EPOLLOUT : EPOLLIN;
	(void)epoll_ctl(c->srv->epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

static void conn_close(struct api_conn *c)
{
	struct api_server *srv = c->srv;

	for (int i = 0; i < API_HTTP_MAX_CONNECTIONS; i++)
		if (srv->conns[i] == c)
			srv->conns[i] = NULL;
	epoll_ctl(srv->epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	free(c->body);
	free(c->out);
	free(c);
}

/* Takes ownership of resp->body. Returns 0, or -ENOMEM (the connection is then closed). */
static int queue_response(struct api_conn *c, struct api_response *resp, bool keep_alive)
{
	bool head_only = c->parser.method == HTTP_HEAD;
	size_t blen = resp->body ? strlen(resp->body) : 0;
	char head[256];
	int n;

	if (resp->status == 204 || !resp->body)
		n = snprintf(head, sizeof(head), "HTTP/1.1 %d %s\r\n%s\r\n", resp->status,
			     reason(resp->status), keep_alive ? "" : "Connection: close\r\n");
	else
		n = snprintf(head, sizeof(head),
			     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
			     "Content-Length: %zu\r\n%s\r\n",
			     resp->status, reason(resp->status), blen,
			     keep_alive ? "" : "Connection: close\r\n");
	if (head_only)
		blen = 0;
	c->out = malloc((size_t)n + blen);
	if (!c->out) {
		free(resp->body);
		resp->body = NULL;
		return -ENOMEM;
	}
	memcpy(c->out, head, (size_t)n);
	if (blen)
		memcpy(c->out + n, resp->body, blen);
	free(resp->body);
	resp->body = NULL;
	c->out_len = (size_t)n + blen;
	c->out_off = 0;
	c->close_after = !keep_alive;
	return 0;
}

/* Answers through api_handle; a refusal before the body (c->refuse) gets the handler's shape. */
static int answer(struct api_conn *c)
{
	struct api_response resp = {0};
	const char *method = http_method_str((enum http_method)c->parser.method);
	/* After an Upgrade request the parser's flag stays set: such a client gets one answer. */
	bool keep_alive = !c->refuse && !c->parser.upgrade && http_should_keep_alive(&c->parser);

	if (c->refuse == 431)
		fault_response(&resp, 431, "request headers too large");
	else if (c->refuse == 505)
		fault_response(&resp, 505, "only HTTP/1.x is served here");
	else if (c->refuse == 414)
		api_handle(&c->srv->be, method, c->url, NULL, 0, &resp); /* the path's own 414 */
	else if (c->refuse == 413 || c->oversized)
		api_handle(&c->srv->be, method, c->url, NULL,
			   c->refuse ? (size_t)c->parser.content_length : c->discarded, &resp);
	else
		api_handle(&c->srv->be, method, c->url, c->body, c->body_len, &resp);
	return queue_response(c, &resp, keep_alive);
}

/* A fault the parser found: answered, then the connection closes. */
static int answer_fault(struct api_conn *c, int status, const char *msg)
{
	struct api_response resp = {0};

	fault_response(&resp, status, msg);
	if (!resp.body)
		return -ENOMEM;
	return queue_response(c, &resp, false);
}

static struct api_conn *conn_of(http_parser *p)
{
	return p->data;
}

static int on_message_begin(http_parser *p)
{
	conn_reset_request(conn_of(p));
	return 0;
}

static int count_head(struct api_conn *c, size_t len)
{
	c->head_bytes += len;
	if (c->head_bytes > API_HTTP_MAX_HEAD) {
		c->refuse = 431;
		http_parser_pause(&c->parser, 1);
	}
	return 0;
}

static int on_url(http_parser *p, const char *at, size_t len)
{
	struct api_conn *c = conn_of(p);

	size_t keep = len;

	if (c->url_len + len > API_HTTP_MAX_URL) {
		c->url_too_long = true;
		/* Keep a prefix, NUL-terminated: the 414 message names the resource. */
		keep = API_HTTP_MAX_URL + 1 - c->url_len;
	}
	memcpy(c->url + c->url_len, at, keep);
	c->url_len += keep;
	c->url[c->url_len] = '\0';
	return count_head(c, len);
}

static int on_header_field(http_parser *p, const char *at, size_t len)
{
	struct api_conn *c = conn_of(p);

	if (c->field_done) { /* a new header begins */
		c->field_done = false;
		c->field_len = 0;
	}
	if (c->field_len == 0 && ++c->nr_headers > API_HTTP_MAX_HEADERS) {
		c->refuse = 431;
		http_parser_pause(p, 1);
		return 0;
	}
	size_t room = sizeof(c->field) - 1 - c->field_len;
	size_t n = len < room ? len : room;

	memcpy(c->field + c->field_len, at, n);
	c->field_len += n;
	c->field[c->field_len] = '\0';
	if (len > room)
		c->field[0] = '\0'; /* too long to be one we read */
	return count_head(c, len);
}

static int on_header_value(http_parser *p, const char *at, size_t len)
{
	struct api_conn *c = conn_of(p);

	if (!c->field_done) {
		c->field_done = true;
		c->in_expect = strcasecmp(c->field, "expect") == 0;
	}
	if (c->in_expect && len >= 12 && strncasecmp(at, "100-continue", 12) == 0)
		c->expect_continue = true;
	return count_head(c, len);
}

/* Percent-decodes the path (not the query): the handler sees a decoded path, as before. */
static void decode_path(char *url)
{
	char *r = url, *w = url;

	while (*r && *r != '?') {
		int hi = r[0] == '%' ? hex_digit(r[1]) : -1;
		int lo = hi >= 0 ? hex_digit(r[2]) : -1;

		if (lo >= 0) {
			*w++ = (char)(hi << 4 | lo);
			r += 3;
		} else {
			*w++ = *r++;
		}
	}
	memmove(w, r, strlen(r) + 1);
}

static int on_headers_complete(http_parser *p)
{
	struct api_conn *c = conn_of(p);
	bool has_length = p->flags & F_CONTENTLENGTH;

	decode_path(c->url);
	/* Refuse before reading any body, so an "Expect: 100-continue" client is never invited. */
	if (p->http_major != 1)
		c->refuse = 505;
	else if (c->url_too_long)
		c->refuse = 414;
	else if (has_length && p->content_length > API_MAX_BODY)
		c->refuse = 413;
	if (c->refuse) {
		http_parser_pause(p, 1);
		return 0;
	}
	if (c->expect_continue && p->http_major == 1 && p->http_minor >= 1) {
		static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";

		/* 25 bytes on a connection with nothing queued: a short write means a dead peer. */
		if (send(c->fd, cont, sizeof(cont) - 1, MSG_NOSIGNAL | MSG_DONTWAIT) !=
		    (ssize_t)sizeof(cont) - 1)
			return -1;
	}
	return 0;
}

static int body_append(struct api_conn *c, const char *data, size_t size)
{
	if (c->body_len + size > c->body_cap) {
		size_t cap = c->body_cap ? c->body_cap : 1024;

		while (cap < c->body_len + size)
			cap *= 2;
		if (cap > API_MAX_BODY)
			cap = API_MAX_BODY;
		char *nb = realloc(c->body, cap);

		if (!nb)
			return -ENOMEM;
		c->body = nb;
		c->body_cap = cap;
	}
	memcpy(c->body + c->body_len, data, size);
	c->body_len += size;
	return 0;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
	struct api_conn *c = conn_of(p);

	if (!c->oversized && len > API_MAX_BODY - c->body_len) {
		/* A chunked upload has no Content-Length to refuse up front: drop, count the rest.
		 */
		c->oversized = true;
		c->discarded = c->body_len;
		free(c->body);
		c->body = NULL;
		c->body_len = c->body_cap = 0;
	}
	if (c->oversized) {
		c->discarded += len;
		return c->discarded > API_HTTP_MAX_DISCARD ? -1 : 0;
	}
	return body_append(c, at, len) < 0 ? -1 : 0;
}

static int on_message_complete(http_parser *p)
{
	struct api_conn *c = conn_of(p);

	c->complete = true;
	http_parser_pause(p, 1);
	return 0;
}

/* Writes what the socket takes. Returns 0, or -1 when the connection is done (closed). */
static int conn_flush(struct api_conn *c)
{
	while (c->out_off < c->out_len) {
		ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (n <= 0) {
			conn_close(c);
			return -1;
		}
		c->out_off += (size_t)n;
		c->last_ms = now_ms();
	}
	free(c->out);
	c->out = NULL;
	c->out_len = c->out_off = 0;
	if (c->close_after) {
		shutdown(c->fd, SHUT_WR);
		c->draining = true;
		c->in_len = 0;
	}
	return 0;
}

/* Reads and drops what the client still sends after its last answer; closes at EOF. */
static void conn_drain(struct api_conn *c)
{
	char scratch[API_HTTP_READ_CHUNK];
	ssize_t n = recv(c->fd, scratch, sizeof(scratch), MSG_DONTWAIT);

	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return;
	if (n > 0)
		c->drained += (size_t)n;
	if (n <= 0 || c->drained > API_HTTP_MAX_DISCARD)
		conn_close(c);
	else
		c->last_ms = now_ms();
}

/*
 * Parses what is buffered: answers each complete request in order, stopping while a response
 * waits to be written. Returns 0, or -1 when the connection was closed.
 */
static int conn_parse(struct api_conn *c)
{
	while (c->in_len && !c->out && !c->draining) {
		size_t n = http_parser_execute(&c->parser, &c->srv->settings, c->in, c->in_len);
		enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
		int r = 0;

		if (n > c->in_len)
			n = c->in_len;
		memmove(c->in, c->in + n, c->in_len - n);
		c->in_len -= n;
		if (e == HPE_PAUSED) {
			http_parser_pause(&c->parser, 0);
			if (c->refuse || c->complete)
				r = answer(c);
			c->complete = false;
		} else if (e == HPE_CB_body && c->oversized) {
			/* Past the discard cap: cut off without an answer. */
			conn_close(c);
			return -1;
		} else if (e != HPE_OK) {
			if (e == HPE_INVALID_VERSION)
				r = answer_fault(c, 505, "only HTTP/1.x is served here");
			else if (e == HPE_HEADER_OVERFLOW)
				r = answer_fault(c, 431, "request headers too large");
			else
				r = answer_fault(c, 400, "malformed HTTP request");
			c->in_len = 0;
		}
		if (r < 0) {
			conn_close(c);
			return -1;
		}
		if (c->out) {
			update_events(c);
			if (conn_flush(c) < 0)
				return -1;
			if (!c->out)
				update_events(c);
		}
	}
	return 0;
}

static void conn_readable(struct api_conn *c)
{
	if (c->in_len >= API_HTTP_IN_CAP) {
		/* A request larger than the buffer is parsed as it streams; this cannot fill up. */
		conn_close(c);
		return;
	}
	size_t want = API_HTTP_IN_CAP - c->in_len;
	ssize_t n = recv(c->fd, c->in + c->in_len,
			 want < API_HTTP_READ_CHUNK ? want : API_HTTP_READ_CHUNK, MSG_DONTWAIT);

	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return;
	if (n <= 0) {
		conn_close(c); /* EOF or reset between requests or mid-request */
		return;
	}
	c->last_ms = now_ms();
	c->in_len += (size_t)n;
	conn_parse(c);
}

static void conn_writable(struct api_conn *c)
{
	if (conn_flush(c) < 0)
		return;
	if (!c->out) {
		update_events(c);
		conn_parse(c); /* a pipelined request may be waiting */
	}
}

static void accept_one(struct api_server *srv)
{
	int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	int slot = -1;

	if (fd < 0)
		return;
	for (int i = 0; i < API_HTTP_MAX_CONNECTIONS && slot < 0; i++)
		if (!srv->conns[i])
			slot = i;
	struct api_conn *c = slot < 0 ? NULL : calloc(1, sizeof(*c));

	if (!c) {
		close(fd); /* over the connection limit: the client sees its connection closed */
		return;
	}
	c->srv = srv;
	c->fd = fd;
	c->last_ms = now_ms();
	http_parser_init(&c->parser, HTTP_REQUEST);
	c->parser.data = c;
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};

	if (epoll_ctl(srv->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		close(fd);
		free(c);
		return;
	}
	srv->conns[slot] = c;
}

/* The next idle deadline, so the timer wakes the loop only when a connection may expire. */
static void rearm_timer(struct api_server *srv)
{
	struct itimerspec its = {0};
	uint64_t first = UINT64_MAX, now = now_ms();

	for (int i = 0; i < API_HTTP_MAX_CONNECTIONS; i++)
		if (srv->conns[i] && srv->conns[i]->last_ms < first)
			first = srv->conns[i]->last_ms;
	if (first != UINT64_MAX) {
		uint64_t due = first + API_HTTP_IDLE_TIMEOUT_MS;
		uint64_t ms = due > now ? due - now : 0;

		its.it_value.tv_sec = (time_t)(ms / 1000);
		its.it_value.tv_nsec = (long)(ms % 1000) * 1000000L;
		if (ms == 0)
			its.it_value.tv_nsec = 1; /* zero would disarm */
	}
	/* Only fails for bad arguments, which these are not. */
	(void)timerfd_settime(srv->timer_fd, 0, &its, NULL);
}

static void on_ready(void *opaque, uint32_t events)
{
	struct api_server *srv = opaque;
	struct epoll_event evs[API_HTTP_EVENTS];
	int n = epoll_wait(srv->epfd, evs, API_HTTP_EVENTS, 0);

	(void)events;
	/* Readiness is level-triggered: what is left over is served on the next loop round. */
	for (int i = 0; i < n; i++) {
		if (evs[i].data.ptr == srv) {
			accept_one(srv);
			continue;
		}
		struct api_conn *c = evs[i].data.ptr;
		bool live = false;

		/*
		 * An earlier event of this round may have closed it. Should a connection accepted
		 * since reuse its address, the stale event only finds nothing to read or write.
		 */
		for (int k = 0; k < API_HTTP_MAX_CONNECTIONS; k++)
			live |= srv->conns[k] == c;
		if (!live)
			continue;
		if (c->out)
			conn_writable(c);
		else if (c->draining)
			conn_drain(c);
		else
			conn_readable(c);
	}
	rearm_timer(srv);
}

static void on_timer(void *opaque, uint32_t events)
{
	struct api_server *srv = opaque;
	uint64_t expirations, now = now_ms();

	(void)events;
	(void)!read(srv->timer_fd, &expirations, sizeof(expirations));
	for (int i = 0; i < API_HTTP_MAX_CONNECTIONS; i++) {
		struct api_conn *c = srv->conns[i];

		if (c && now - c->last_ms >= API_HTTP_IDLE_TIMEOUT_MS)
			conn_close(c);
	}
	rearm_timer(srv);
}

/* Removes a leftover socket from a previous run; refuses to clobber anything else. */
static int remove_stale_socket(const char *path)
{
	struct stat st;

	if (lstat(path, &st) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISSOCK(st.st_mode))
		return -EEXIST;
	if (unlink(path) < 0 && errno != ENOENT)
		return -errno;
	return 0;
}

static int listen_unix(struct api_server *srv, const char *path)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	struct stat st;
	int fd, ret;

	if (strlen(path) >= sizeof(addr.sun_path))
		return -ENAMETOOLONG;
	strcpy(addr.sun_path, path);

	ret = remove_stale_socket(path);
	if (ret < 0)
		return ret;

	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
		ret = -errno;
		goto err_close;
	}
	/* Nobody can connect before listen(), so tightening the mode here leaves no window. */
	if (chmod(path, 0600) < 0 || lstat(path, &st) < 0) {
		ret = -errno;
		goto err_unlink;
	}
	if (listen(fd, API_HTTP_MAX_CONNECTIONS) < 0) {
		ret = -errno;
		goto err_unlink;
	}
	srv->listen_fd = fd;
	srv->sock_dev = st.st_dev;
	srv->sock_ino = st.st_ino;
	return 0;

err_unlink:
	unlink(path);
err_close:
	close(fd);
	return ret;
}

static void unlink_own_socket(struct api_server *srv)
{
	struct stat st;

	if (lstat(srv->sock_path, &st) == 0 && st.st_dev == srv->sock_dev &&
	    st.st_ino == srv->sock_ino)
		unlink(srv->sock_path);
}

int api_server_start(struct api_server **out, const char *sock_path, const struct api_backend *be,
		     struct evloop *loop)
{
	struct api_server *srv;
	int ret;

	srv = calloc(1, sizeof(*srv));
	if (!srv)
		return -ENOMEM;
	srv->be = *be;
	srv->loop = loop;
	srv->listen_fd = srv->timer_fd = srv->epfd = -1;
	http_parser_settings_init(&srv->settings);
	srv->settings.on_message_begin = on_message_begin;
	srv->settings.on_url = on_url;
	srv->settings.on_header_field = on_header_field;
	srv->settings.on_header_value = on_header_value;
	srv->settings.on_headers_complete = on_headers_complete;
	srv->settings.on_body = on_body;
	srv->settings.on_message_complete = on_message_complete;
	srv->sock_path = strdup(sock_path);
	if (!srv->sock_path) {
		ret = -ENOMEM;
		goto err_free;
	}

	ret = listen_unix(srv, sock_path);
	if (ret < 0)
		goto err_free;

	srv->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	srv->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (srv->timer_fd < 0 || srv->epfd < 0) {
		ret = -errno;
		goto err_fds;
	}
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = srv};

	if (epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->listen_fd, &ev) < 0) {
		ret = -errno;
		goto err_fds;
	}
	ret = evloop_add(loop, srv->epfd, EPOLLIN, on_ready, srv);
	if (ret < 0)
		goto err_fds;
	ret = evloop_add(loop, srv->timer_fd, EPOLLIN, on_timer, srv);
	if (ret < 0)
		goto err_del;

	*out = srv;
	return 0;

err_del:
	evloop_del(loop, srv->epfd);
err_fds:
	if (srv->epfd >= 0)
		close(srv->epfd);
	if (srv->timer_fd >= 0)
		close(srv->timer_fd);
	close(srv->listen_fd);
	unlink_own_socket(srv);
err_free:
	free(srv->sock_path);
	free(srv);
	return ret;
}

/* Call on the loop thread, or with the loop not running: it edits the loop's handler table. */
void api_server_stop(struct api_server *srv)
{
	if (!srv)
		return;
	evloop_del(srv->loop, srv->timer_fd);
	evloop_del(srv->loop, srv->epfd);
	for (int i = 0; i < API_HTTP_MAX_CONNECTIONS; i++)
		if (srv->conns[i])
			conn_close(srv->conns[i]);
	close(srv->epfd);
	close(srv->timer_fd);
	close(srv->listen_fd);
	unlink_own_socket(srv);
	free(srv->sock_path);
	free(srv);
}
