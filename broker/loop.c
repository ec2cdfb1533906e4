/* Event loop: nonblocking accept/read/write on many connections, the credential helpers'
 * stdout pipes, and libcurl's multi interface, all on one epoll set, so helpers and upstream
 * transfers of different connections run concurrently. Each connection has at most one request
 * in flight, so its replies stay in order. A bad frame costs its sender an error reply, never
 * the loop. Closed connections and curl sockets are freed after the event batch that might
 * still name them. */
#include "loop.h"
#include "frame.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

enum ep_kind { EP_GUEST_LISTEN, EP_CTL_LISTEN, EP_SIGNAL, EP_CONN, EP_CURL, EP_HELPER };

struct ep {
	enum ep_kind kind;
	int fd; /* -1 once closed: later events in the same batch are ignored */
};

struct conn {
	struct ep ep; /* first: epoll data points here */
	int is_ctl;
	uint8_t *in;
	size_t in_len, in_cap;
	uint8_t *out;
	size_t out_len, out_off, out_cap;
	int eof;		/* the peer sent everything it will send */
	int dead;		/* stream out of sync: stop reading, close once out is flushed */
	struct broker_job *job; /* the request in flight */
	struct ep hep;		/* its credential helper's stdout, while watched (fd >= 0) */
	int helper_wait;	/* helper output read, waiting for it to exit */
	int64_t last_ns;
	struct conn *next;
};

struct curl_sock {
	struct ep ep;
	struct curl_sock *next; /* graveyard link */
};

struct loop {
	struct broker *b;
	int epfd;
	CURLM *multi;
	int64_t curl_deadline; /* CLOCK_MONOTONIC ns, or -1 */
	struct conn *conns, *dead_conns;
	struct curl_sock *dead_socks;
	size_t nconns;
};

int loop_listen_unix(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct stat st;
	int fd, e;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	if (!lstat(path, &st)) {
		if (!S_ISSOCK(st.st_mode))
			return -EEXIST;
		unlink(path);
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || chmod(path, 0600) || listen(fd, 64)) {
		e = -errno;
		close(fd);
		return e;
	}
	return fd;
}

static int ep_mod(struct loop *l, struct conn *c)
{
	struct epoll_event ev = {.data.ptr = &c->ep};

	if (!c->eof && !c->dead && !c->job && c->out_len - c->out_off < LOOP_OUT_HIGHWAT)
		ev.events |= EPOLLIN;
	if (c->out_len > c->out_off)
		ev.events |= EPOLLOUT;
	return epoll_ctl(l->epfd, EPOLL_CTL_MOD, c->ep.fd, &ev) ? -errno : 0;
}

static void unwatch_helper(struct loop *l, struct conn *c)
{
	if (c->hep.fd >= 0)
		epoll_ctl(l->epfd, EPOLL_CTL_DEL, c->hep.fd, NULL);
	c->hep.fd = -1;
}

static int queue_reply(struct conn *c, const char *msg, size_t len);
static void conn_step(struct loop *l, struct conn *c);
static void conn_close(struct loop *l, struct conn *c);

/* Moves c's job on after its helper finished reading (or hit its deadline). */
static void job_advance(struct loop *l, struct conn *c)
{
	char *reply = NULL;
	size_t rlen = 0;
	int r;

	unwatch_helper(l, c);
	r = broker_job_advance(l->b, c->job, &reply, &rlen);
	c->helper_wait = r == JOB_WAIT;
	if (r == JOB_WAIT)
		return;
	if (r == JOB_TRANSFER) {
		CURL *e = broker_job_easy(c->job);

		curl_easy_setopt(e, CURLOPT_PRIVATE, c->job);
		if (curl_multi_add_handle(l->multi, e) == CURLM_OK)
			return;
		r = broker_guest_finish(l->b, c->job, CURLE_OUT_OF_MEMORY, &reply, &rlen);
	}
	c->job = NULL; /* freed by broker_job_advance / broker_guest_finish */
	if (r < 0 || queue_reply(c, reply, rlen)) {
		free(reply);
		conn_close(l, c);
		return;
	}
	free(reply);
	conn_step(l, c);
}

/* Starts watching a new job's helper. */
static int watch_helper(struct loop *l, struct conn *c)
{
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &c->hep};

	c->hep.fd = broker_job_helper_fd(c->job);
	if (c->hep.fd >= 0 && epoll_ctl(l->epfd, EPOLL_CTL_ADD, c->hep.fd, &ev))
		c->hep.fd = -1;
	return c->hep.fd >= 0 ? 0 : -EIO;
}

static void conn_close(struct loop *l, struct conn *c)
{
	struct conn **pp;

	if (c->ep.fd < 0)
		return;
	for (pp = &l->conns; *pp; pp = &(*pp)->next) {
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	}
	epoll_ctl(l->epfd, EPOLL_CTL_DEL, c->ep.fd, NULL);
	close(c->ep.fd);
	c->ep.fd = -1;
	/* Nobody is left to read the reply of a request in flight: abort it (it is audited). */
	if (c->job) {
		unwatch_helper(l, c);
		if (broker_job_state(c->job) == JOB_TRANSFER)
			curl_multi_remove_handle(l->multi, broker_job_easy(c->job));
		broker_job_abort(l->b, c->job);
		c->job = NULL;
	}
	c->next = l->dead_conns;
	l->dead_conns = c;
	l->nconns--;
}

static void reap(struct loop *l)
{
	while (l->dead_conns) {
		struct conn *c = l->dead_conns;

		l->dead_conns = c->next;
		free(c->in);
		free(c->out);
		free(c);
	}
	while (l->dead_socks) {
		struct curl_sock *s = l->dead_socks;

		l->dead_socks = s->next;
		free(s);
	}
}

static int queue_reply(struct conn *c, const char *msg, size_t len)
{
	size_t need;

	if (c->out_off && c->out_off == c->out_len)
		c->out_off = c->out_len = 0;
	need = c->out_len + FRAME_HDR + len;
	if (need > c->out_cap) {
		uint8_t *n = realloc(c->out, need);

		if (!n)
			return -ENOMEM;
		c->out = n;
		c->out_cap = need;
	}
	frame_header(c->out + c->out_len, (uint32_t)len);
	memcpy(c->out + c->out_len + FRAME_HDR, msg, len);
	c->out_len = need;
	return 0;
}

/* Writes what the socket takes. Returns 0, or -errno when the peer is gone. */
static int conn_flush(struct conn *c)
{
	while (c->out_off < c->out_len) {
		ssize_t n = send(c->ep.fd, c->out + c->out_off, c->out_len - c->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (n <= 0)
			return n < 0 ? -errno : -EPIPE;
		c->out_off += (size_t)n;
	}
	c->out_off = c->out_len = 0;
	return 0;
}

/* True when a whole frame (or an oversized header) waits in c->in. */
static int has_frame(const struct conn *c)
{
	size_t plen;

	return frame_peek(c->in, c->in_len, &plen) != 0;
}

/* Handles complete frames in c->in until one starts an upstream transfer. */
static int conn_process(struct loop *l, struct conn *c)
{
	size_t off = 0, plen;
	int r = 0;

	while (!c->dead && !c->job && c->out_len - c->out_off < LOOP_OUT_HIGHWAT) {
		struct broker_job *job = NULL;
		char *reply = NULL;
		size_t rlen = 0;

		r = frame_peek(c->in + off, c->in_len - off, &plen);
		if (r == 0)
			break;
		if (r < 0) {
			/* Oversized frame: answer once, then close (the stream is out of sync). */
			r = c->is_ctl
				? 0
				: broker_reject_frame(l->b, "frame over 1 MiB", &reply, &rlen);
			if (!r && reply)
				r = queue_reply(c, reply, rlen);
			free(reply);
			c->dead = 1;
			off = c->in_len;
			break;
		}
		if (c->is_ctl)
			r = broker_handle_ctl(l->b, c->in + off + FRAME_HDR, plen, &reply, &rlen);
		else
			r = broker_guest_begin(l->b, c->in + off + FRAME_HDR, plen, &reply, &rlen,
					       &job);
		off += FRAME_HDR + plen;
		if (r)
			break;
		if (job) {
			*broker_job_owner(job) = c;
			c->job = job;
			/* Unwatchable: the next tick fails it as a helper failure. */
			if (watch_helper(l, c))
				c->helper_wait = 1;
			break; /* one request in flight per connection */
		}
		r = queue_reply(c, reply, rlen);
		free(reply);
		if (r)
			break;
	}
	if (off) {
		memmove(c->in, c->in + off, c->in_len - off);
		c->in_len -= off;
	}
	return r;
}

static int conn_read(struct conn *c)
{
	for (;;) {
		ssize_t n;

		if (c->in_cap - c->in_len < 65536 && c->in_cap < FRAME_HDR + FRAME_MAX + 65536) {
			size_t cap = c->in_cap ? c->in_cap * 2 : 65536;
			uint8_t *nb;

			/* One whole frame plus a read's worth is all we ever buffer. */
			if (cap > FRAME_HDR + FRAME_MAX + 65536)
				cap = FRAME_HDR + FRAME_MAX + 65536;
			nb = realloc(c->in, cap);
			if (!nb)
				return -ENOMEM;
			c->in = nb;
			c->in_cap = cap;
		}
		if (c->in_len == c->in_cap)
			break;
		n = recv(c->ep.fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		if (n <= 0) {
			c->eof = 1;
			break;
		}
		c->in_len += (size_t)n;
		if (c->in_len >= FRAME_HDR)
			break; /* process, then read more on the next wakeup */
	}
	return 0;
}

/* Runs whatever c can do now: process frames, flush replies, re-arm or close. */
static void conn_step(struct loop *l, struct conn *c)
{
	if (c->ep.fd < 0)
		return;
	if (conn_process(l, c)) {
		conn_close(l, c);
		return;
	}
	/* Flush; frames held back by the high-water mark run once the socket took the replies. */
	for (;;) {
		if (conn_flush(c)) {
			conn_close(l, c);
			return;
		}
		if (c->dead || c->job || c->out_len != c->out_off || !has_frame(c))
			break;
		if (conn_process(l, c)) {
			conn_close(l, c);
			return;
		}
	}
	if (!c->job && ((c->eof && !has_frame(c)) || c->dead) && c->out_off == c->out_len) {
		conn_close(l, c);
		return;
	}
	if (ep_mod(l, c))
		conn_close(l, c);
}

static void accept_conns(struct loop *l, int lfd, int is_ctl)
{
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct epoll_event ev = {.events = EPOLLIN};
		struct conn *c;

		if (fd < 0)
			return;
		if (l->nconns >= LOOP_MAX_CONNS) {
			broker_log(l->b, LOG_WARN, "%d connections: refusing one", LOOP_MAX_CONNS);
			close(fd);
			continue;
		}
		c = calloc(1, sizeof(*c));
		if (!c) {
			close(fd);
			return;
		}
		c->ep.kind = EP_CONN;
		c->ep.fd = fd;
		c->hep.kind = EP_HELPER;
		c->hep.fd = -1;
		c->is_ctl = is_ctl;
		c->last_ns = broker_now_ns();
		ev.data.ptr = &c->ep;
		if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev)) {
			close(fd);
			free(c);
			continue;
		}
		c->next = l->conns;
		l->conns = c;
		l->nconns++;
	}
}

static void sweep_idle(struct loop *l)
{
	int64_t now = broker_now_ns();
	struct conn *c = l->conns, *next;

	for (; c; c = next) {
		next = c->next;
		if (!c->job && now - c->last_ns > (int64_t)LOOP_IDLE_S * 1000000000LL)
			conn_close(l, c);
	}
}

/* curl tells us which sockets to watch. */
static int on_curl_socket(CURL *e, curl_socket_t s, int what, void *userp, void *socketp)
{
	struct loop *l = userp;
	struct curl_sock *cs = socketp;
	struct epoll_event ev = {0};

	(void)e;
	if (what == CURL_POLL_REMOVE) {
		if (cs) {
			epoll_ctl(l->epfd, EPOLL_CTL_DEL, s, NULL);
			cs->ep.fd = -1;
			cs->next = l->dead_socks;
			l->dead_socks = cs;
			curl_multi_assign(l->multi, s, NULL);
		}
		return 0;
	}
	if (what == CURL_POLL_IN || what == CURL_POLL_INOUT)
		ev.events |= EPOLLIN;
	if (what == CURL_POLL_OUT || what == CURL_POLL_INOUT)
		ev.events |= EPOLLOUT;
	if (!cs) {
		cs = calloc(1, sizeof(*cs));
		if (!cs)
			return -1;
		cs->ep.kind = EP_CURL;
		cs->ep.fd = s;
		ev.data.ptr = &cs->ep;
		if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, s, &ev)) {
			free(cs);
			return -1;
		}
		curl_multi_assign(l->multi, s, cs);
		return 0;
	}
	ev.data.ptr = &cs->ep;
	return epoll_ctl(l->epfd, EPOLL_CTL_MOD, s, &ev) ? -1 : 0;
}

static int on_curl_timer(CURLM *m, long timeout_ms, void *userp)
{
	struct loop *l = userp;

	(void)m;
	l->curl_deadline = timeout_ms < 0 ? -1 : broker_now_ns() + timeout_ms * 1000000LL;
	return 0;
}

/* Collects finished transfers and answers their connections. */
static void curl_done(struct loop *l)
{
	CURLMsg *m;
	int left;

	while ((m = curl_multi_info_read(l->multi, &left))) {
		struct broker_job *job = NULL;
		struct conn *c;
		char *reply = NULL;
		size_t rlen = 0;
		CURLcode rc = m->data.result;
		CURL *e = m->easy_handle;

		if (m->msg != CURLMSG_DONE)
			continue;
		curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&job);
		curl_multi_remove_handle(l->multi, e);
		c = *broker_job_owner(job);
		c->job = NULL;
		if (broker_guest_finish(l->b, job, (int)rc, &reply, &rlen)) {
			conn_close(l, c);
			continue;
		}
		c->last_ns = broker_now_ns();
		if (queue_reply(c, reply, rlen))
			conn_close(l, c);
		else
			conn_step(l, c);
		free(reply);
	}
}

static void curl_action(struct loop *l, curl_socket_t s, int mask)
{
	int running;

	curl_multi_socket_action(l->multi, s, mask, &running);
	curl_done(l);
}

static int add_ep(int epfd, struct ep *e)
{
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = e};

	return epoll_ctl(epfd, EPOLL_CTL_ADD, e->fd, &ev) ? -errno : 0;
}

/* Helpers past their deadline, or read and waiting to exit, move on. */
static void helper_ticks(struct loop *l)
{
	int64_t now = broker_now_ns();
	struct conn *c, *next;

	for (c = l->conns; c; c = next) {
		next = c->next;
		if (c->job && broker_job_state(c->job) == JOB_HELPER &&
		    (c->helper_wait || now >= broker_job_deadline(c->job)))
			job_advance(l, c);
	}
}

static int wait_ms(const struct loop *l)
{
	int64_t next = l->curl_deadline, now = broker_now_ns(), left;
	const struct conn *c;

	for (c = l->conns; c; c = c->next) {
		int64_t d;

		if (!c->job || broker_job_state(c->job) != JOB_HELPER)
			continue;
		d = c->helper_wait ? now + 2000000 : broker_job_deadline(c->job);
		if (next < 0 || d < next)
			next = d;
	}
	if (next < 0)
		return 1000;
	left = (next - now + 999999) / 1000000;
	return left <= 0 ? 0 : left > 1000 ? 1000 : (int)left;
}

int loop_run(struct broker *b, int guest_fd, int ctl_fd)
{
	struct loop l = {.b = b, .epfd = -1, .curl_deadline = -1};
	struct ep eg = {EP_GUEST_LISTEN, guest_fd}, ec = {EP_CTL_LISTEN, ctl_fd};
	struct ep es = {EP_SIGNAL, -1};
	sigset_t mask;
	int r = 0, stop = 0;

	sigemptyset(&mask);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGTERM);
	if (sigprocmask(SIG_BLOCK, &mask, NULL))
		return -errno;
	es.fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	l.epfd = epoll_create1(EPOLL_CLOEXEC);
	l.multi = curl_multi_init();
	if (es.fd < 0 || l.epfd < 0 || !l.multi) {
		r = l.multi ? -errno : -ENOMEM;
		goto out;
	}
	curl_multi_setopt(l.multi, CURLMOPT_SOCKETFUNCTION, on_curl_socket);
	curl_multi_setopt(l.multi, CURLMOPT_SOCKETDATA, &l);
	curl_multi_setopt(l.multi, CURLMOPT_TIMERFUNCTION, on_curl_timer);
	curl_multi_setopt(l.multi, CURLMOPT_TIMERDATA, &l);
	if ((r = add_ep(l.epfd, &eg)) || (r = add_ep(l.epfd, &ec)) || (r = add_ep(l.epfd, &es)))
		goto out;
	while (!stop) {
		struct epoll_event evs[32];
		int n = epoll_wait(l.epfd, evs, 32, wait_ms(&l)), i;

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = -errno;
			break;
		}
		for (i = 0; i < n; i++) {
			struct ep *e = evs[i].data.ptr;
			struct conn *c;
			int m = 0;

			if (e->fd < 0)
				continue; /* closed earlier in this batch */
			switch (e->kind) {
			case EP_SIGNAL:
				stop = 1;
				break;
			case EP_GUEST_LISTEN:
			case EP_CTL_LISTEN:
				accept_conns(&l, e->fd, e->kind == EP_CTL_LISTEN);
				break;
			case EP_CURL:
				if (evs[i].events & EPOLLIN)
					m |= CURL_CSELECT_IN;
				if (evs[i].events & EPOLLOUT)
					m |= CURL_CSELECT_OUT;
				if (evs[i].events & (EPOLLERR | EPOLLHUP))
					m |= CURL_CSELECT_ERR;
				curl_action(&l, e->fd, m);
				break;
			case EP_HELPER:
				c = (struct conn *)((char *)e - offsetof(struct conn, hep));
				if (c->job && broker_job_read(c->job))
					job_advance(&l, c);
				break;
			case EP_CONN:
				c = (struct conn *)e;
				c->last_ns = broker_now_ns();
				if ((evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) &&
				    conn_read(c)) {
					conn_close(&l, c);
					break;
				}
				conn_step(&l, c);
				/* Peer gone for good (not a half close): it cannot take the reply
				 * of a transfer in flight, and HUP would keep waking us. */
				if ((evs[i].events & (EPOLLHUP | EPOLLERR)) && c->ep.fd >= 0 &&
				    c->job)
					conn_close(&l, c);
				break;
			}
		}
		if (l.curl_deadline >= 0 && broker_now_ns() >= l.curl_deadline) {
			l.curl_deadline = -1;
			curl_action(&l, CURL_SOCKET_TIMEOUT, 0);
		}
		helper_ticks(&l);
		sweep_idle(&l);
		reap(&l);
	}
out:
	while (l.conns) /* also aborts (and audits) transfers still running */
		conn_close(&l, l.conns);
	if (l.multi)
		curl_multi_cleanup(l.multi);
	reap(&l);
	if (l.epfd >= 0)
		close(l.epfd);
	if (es.fd >= 0)
		close(es.fd);
	return r;
}
