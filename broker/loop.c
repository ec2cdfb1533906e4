/* Event loop: nonblocking accept/read/write on many connections; each complete frame is
 * handled synchronously (the upstream request is time-capped), replies are queued per
 * connection. A bad frame costs its sender an error reply, never the loop. */
#include "loop.h"
#include "frame.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

enum ep_kind { EP_GUEST_LISTEN, EP_CTL_LISTEN, EP_SIGNAL, EP_CONN };

struct ep {
	enum ep_kind kind;
	int fd;
};

struct conn {
	struct ep ep;	/* first: epoll data points here */
	int is_ctl;
	uint8_t *in;
	size_t in_len, in_cap;
	uint8_t *out;
	size_t out_len, out_off, out_cap;
	int eof;	/* the peer sent everything it will send */
	int dead;	/* stream out of sync: stop reading, close once out is flushed */
	int64_t last_ns;
	struct conn *next;
};

struct loop {
	struct broker *b;
	int epfd;
	struct conn *conns;
	size_t nconns;
};

int loop_listen_unix(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
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
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || chmod(path, 0600) ||
	    listen(fd, 64)) {
		e = -errno;
		close(fd);
		return e;
	}
	return fd;
}

static int ep_mod(struct loop *l, struct conn *c)
{
	struct epoll_event ev = { .data.ptr = &c->ep };

	if (!c->eof && !c->dead && c->out_len - c->out_off < LOOP_OUT_HIGHWAT)
		ev.events |= EPOLLIN;
	if (c->out_len > c->out_off)
		ev.events |= EPOLLOUT;
	return epoll_ctl(l->epfd, EPOLL_CTL_MOD, c->ep.fd, &ev) ? -errno : 0;
}

static void conn_close(struct loop *l, struct conn *c)
{
	struct conn **pp;

	for (pp = &l->conns; *pp; pp = &(*pp)->next) {
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	}
	epoll_ctl(l->epfd, EPOLL_CTL_DEL, c->ep.fd, NULL);
	close(c->ep.fd);
	free(c->in);
	free(c->out);
	free(c);
	l->nconns--;
}

static int queue_reply(struct conn *c, const char *msg, size_t len)
{
	size_t need = c->out_len + FRAME_HDR + len;

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

/* Handles every complete frame in c->in. */
static int conn_process(struct loop *l, struct conn *c)
{
	size_t off = 0, plen;
	int r;

	while (!c->dead && c->out_len - c->out_off < LOOP_OUT_HIGHWAT) {
		char *reply = NULL;
		size_t rlen = 0;

		r = frame_peek(c->in + off, c->in_len - off, &plen);
		if (r == 0)
			break;
		if (r < 0) {
			/* Oversized frame: answer once, then close (the stream is out of sync). */
			r = c->is_ctl ? 0 : broker_reject_frame(l->b, "frame over 1 MiB", &reply,
								 &rlen);
			if (!r && reply)
				queue_reply(c, reply, rlen);
			free(reply);
			c->dead = 1;
			off = c->in_len;
			break;
		}
		if (c->is_ctl)
			r = broker_handle_ctl(l->b, c->in + off + FRAME_HDR, plen, &reply, &rlen);
		else
			r = broker_handle_guest(l->b, c->in + off + FRAME_HDR, plen, &reply, &rlen);
		off += FRAME_HDR + plen;
		if (r)
			return r;
		r = queue_reply(c, reply, rlen);
		free(reply);
		if (r)
			return r;
	}
	if (off) {
		memmove(c->in, c->in + off, c->in_len - off);
		c->in_len -= off;
	}
	return 0;
}

/* True when a whole frame (or an oversized header) waits in c->in. */
static int has_frame(const struct conn *c)
{
	size_t plen;

	return frame_peek(c->in, c->in_len, &plen) != 0;
}

static int conn_read(struct loop *l, struct conn *c)
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
	return conn_process(l, c);
}

static void accept_conns(struct loop *l, int lfd, int is_ctl)
{
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct epoll_event ev = { .events = EPOLLIN };
		struct conn *c;

		if (fd < 0)
			return;
		if (l->nconns >= LOOP_MAX_CONNS) {
			if (l->b->log)
				fprintf(l->b->log, "cove-broker: %d connections: refusing one\n",
					LOOP_MAX_CONNS);
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
		if (now - c->last_ns > (int64_t)LOOP_IDLE_S * 1000000000LL)
			conn_close(l, c);
	}
}

static int add_ep(int epfd, struct ep *e)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = e };

	return epoll_ctl(epfd, EPOLL_CTL_ADD, e->fd, &ev) ? -errno : 0;
}

int loop_run(struct broker *b, int guest_fd, int ctl_fd)
{
	struct loop l = { .b = b, .epfd = -1 };
	struct ep eg = { EP_GUEST_LISTEN, guest_fd }, ec = { EP_CTL_LISTEN, ctl_fd };
	struct ep es = { EP_SIGNAL, -1 };
	sigset_t mask;
	int r = 0, stop = 0;

	sigemptyset(&mask);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGTERM);
	if (sigprocmask(SIG_BLOCK, &mask, NULL))
		return -errno;
	es.fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	l.epfd = epoll_create1(EPOLL_CLOEXEC);
	if (es.fd < 0 || l.epfd < 0) {
		r = -errno;
		goto out;
	}
	if ((r = add_ep(l.epfd, &eg)) || (r = add_ep(l.epfd, &ec)) || (r = add_ep(l.epfd, &es)))
		goto out;
	while (!stop) {
		struct epoll_event evs[32];
		int n = epoll_wait(l.epfd, evs, 32, 1000), i;

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = -errno;
			break;
		}
		for (i = 0; i < n; i++) {
			struct ep *e = evs[i].data.ptr;
			struct conn *c;

			if (e->kind == EP_SIGNAL) {
				stop = 1;
				continue;
			}
			if (e->kind == EP_GUEST_LISTEN || e->kind == EP_CTL_LISTEN) {
				accept_conns(&l, e->fd, e->kind == EP_CTL_LISTEN);
				continue;
			}
			c = (struct conn *)e;
			c->last_ns = broker_now_ns();
			if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
				r = conn_read(&l, c);
				if (r) {
					conn_close(&l, c);
					if (r == -ENOMEM)
						break;
					r = 0;
					continue;
				}
			}
			/* After input is handled, flush; frames held back by the high-water mark
			 * run once the socket took the replies. */
			if (conn_flush(c)) {
				conn_close(&l, c);
				continue;
			}
			while (!c->dead && c->out_len == c->out_off && has_frame(c)) {
				if (conn_process(&l, c) || conn_flush(c)) {
					c->dead = 1;
					c->out_off = c->out_len = 0;
				}
			}
			if (((c->eof && !has_frame(c)) || c->dead) && c->out_off == c->out_len) {
				conn_close(&l, c);
				continue;
			}
			if (ep_mod(&l, c))
				conn_close(&l, c);
		}
		if (r)
			break;
		sweep_idle(&l);
	}
out:
	while (l.conns)
		conn_close(&l, l.conns);
	if (l.epfd >= 0)
		close(l.epfd);
	if (es.fd >= 0)
		close(es.fd);
	return r;
}
