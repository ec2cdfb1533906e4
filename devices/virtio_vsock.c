/* virtio-vsock: guest stream connections to host Unix sockets (Firecracker's hybrid protocol). */
#include "devices/virtio_vsock.h"

#include <errno.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/token_bucket.h"

#define VIRTIO_ID_VSOCK	 19
#define RXQ		 0
#define TXQ		 1
#define EVQ		 2
#define LINE_MAX_LEN	 32
#define FIRST_LOCAL_PORT (1u << 30)

struct vsock_conn {
	int fd;
	enum vsock_state st;
	bool zombie;	     /* fd closed; freed at the next sweep */
	uint32_t local_port; /* host side of the vsock address */
	uint32_t peer_port;  /* guest side */
	struct vsock_credit cr;
	uint32_t events; /* registered with epfd */
	bool registered;
	bool readable;	     /* host socket may have data (EPOLLIN is off until it says EAGAIN) */
	bool hup;	     /* epoll reported HUP/ERR: no longer watched */
	bool host_eof;	     /* host will send no more */
	uint32_t guest_shut; /* VSOCK_SHUTDOWN_* the guest sent */
	bool host_wr_shut;   /* we did shutdown(SHUT_WR) */
	bool need_request, need_response, need_credit, need_shutdown;
	uint8_t *buf; /* guest->host bytes the host socket did not take yet (ring of buf_cap) */
	uint32_t buf_head, buf_len, buf_cap;
	char line[LINE_MAX_LEN];
	size_t line_len;
	struct token_bucket tx_tb, rx_tb; /* guest->host, host->guest bytes (--vsock-rate) */
	bool tx_throttled; /* buffered bytes wait for tx_tb (no EPOLLOUT meanwhile) */
};

static void config_read(void *dev, uint32_t off, uint8_t *data, uint32_t len)
{
	struct virtio_vsock *v = dev;
	uint8_t cfg[8];
	for (int i = 0; i < 8; i++)
		cfg[i] = (uint8_t)(v->guest_cid >> (8 * i));
	memcpy(data, cfg + off, len); /* the transport checked off/len against config_size */
}

static void conn_watch(struct virtio_vsock *v, struct vsock_conn *c)
{
	if (c->zombie || c->hup)
		return;
	uint32_t want = 0;
	if (c->st == VSOCK_ST_HOST_HANDSHAKE ||
	    (c->st == VSOCK_ST_ESTABLISHED && !c->readable && !c->host_eof &&
	     !(c->guest_shut & VSOCK_SHUTDOWN_RCV)))
		want |= EPOLLIN;
	if (c->buf_len && !c->tx_throttled)
		want |= EPOLLOUT;
	if (c->registered && want == c->events)
		return;
	struct epoll_event ev = {.events = want, .data.ptr = c};
	if (epoll_ctl(v->epfd, c->registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd, &ev) == 0) {
		c->registered = true;
		c->events = want;
	}
}

static void conn_kill(struct virtio_vsock *v, struct vsock_conn *c)
{
	if (c->zombie)
		return;
	if (c->registered)
		epoll_ctl(v->epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	c->fd = -1;
	c->zombie = true;
	c->st = VSOCK_ST_CLOSED;
}

static void listen_watch(struct virtio_vsock *v, bool on)
{
	struct epoll_event ev = {.events = on ? EPOLLIN : 0, .data.ptr = NULL};
	if (epoll_ctl(v->epfd, EPOLL_CTL_MOD, v->listen_fd, &ev) == 0)
		v->listen_paused = !on;
}

static void sweep(struct virtio_vsock *v)
{
	int before = v->nr_conns;
	for (int i = 0; i < v->nr_conns;) {
		struct vsock_conn *c = v->conns[i];
		if (!c->zombie) {
			i++;
			continue;
		}
		v->buffered -= c->buf_len;
		vsock_pool_release(&v->pool, c->cr.buf_alloc);
		free(c->buf);
		free(c);
		v->conns[i] = v->conns[--v->nr_conns];
	}
	/* accept() ran out of fds earlier: a closed connection may have freed one. */
	if (v->listen_paused && v->nr_conns < before)
		listen_watch(v, true);
}

static uint64_t vnow(struct virtio_vsock *v)
{
	return v->clock_ns(v->clock_ctx);
}

/* Arms rate_tfd to fire in `wait` ns unless it fires sooner already. */
static void rate_arm(struct virtio_vsock *v, uint64_t wait)
{
	uint64_t at = vnow(v) + (wait ? wait : 1);
	v->throttle_waits++;
	if (v->rate_deadline_ns && v->rate_deadline_ns <= at)
		return;
	v->rate_deadline_ns = at;
	struct itimerspec its = {.it_value = {.tv_sec = (time_t)(wait / 1000000000ULL),
					      .tv_nsec = (long)(wait % 1000000000ULL) + !wait}};
	timerfd_settime(v->rate_tfd, 0, &its, NULL);
}

/* Of `want` bytes, how many the bucket lets through now (taken); arms the timer at 0. */
static uint32_t rate_take(struct virtio_vsock *v, struct token_bucket *tb, uint32_t want)
{
	if (tb_unlimited(tb) || !want)
		return want;
	uint64_t now = vnow(v), have = tb_available(tb, now);
	uint32_t n = have < want ? (uint32_t)have : want;
	if (n)
		tb_consume(tb, n, now);
	if (n < want) {
		/* Wait for a useful amount, never for more than the bucket holds. */
		uint64_t next = want - n < 4096 ? want - n : 4096;
		if (next > tb->size)
			next = tb->size;
		rate_arm(v, tb_wait_ns(tb, next, now));
	}
	return n;
}

static struct vsock_conn *conn_new(struct virtio_vsock *v, int fd, enum vsock_state st)
{
	if (v->nr_conns >= VSOCK_MAX_CONNS)
		return NULL;
	struct vsock_conn *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->fd = fd;
	c->st = st;
	/* The rate was checked by virtio_vsock_set_rate: these cannot fail. */
	tb_init(&c->tx_tb, v->rate, 0, 1000000000ULL, vnow(v));
	tb_init(&c->rx_tb, v->rate, 0, 1000000000ULL, vnow(v));
	c->cr.buf_alloc = vsock_pool_grant(&v->pool);
	v->conns[v->nr_conns++] = c;
	conn_watch(v, c);
	return c;
}

static struct vsock_hdr host_hdr(struct virtio_vsock *v, struct vsock_conn *c, uint16_t op)
{
	/* A connection that started small grows once the pool has room (never while buffering). */
	if (!c->buf)
		vsock_pool_grow(&v->pool, &c->cr.buf_alloc);
	return (struct vsock_hdr){.src_cid = VSOCK_HOST_CID,
				  .dst_cid = v->guest_cid,
				  .src_port = c->local_port,
				  .dst_port = c->peer_port,
				  .type = VSOCK_TYPE_STREAM,
				  .op = op,
				  .buf_alloc = c->cr.buf_alloc,
				  .fwd_cnt = c->cr.fwd_cnt};
}

static void queue_rst(struct virtio_vsock *v, uint32_t local_port, uint32_t peer_port)
{
	if (v->rst_n == VSOCK_RST_QUEUE)
		return; /* the guest times out that connection instead */
	v->rst_q[(v->rst_head + v->rst_n++) % VSOCK_RST_QUEUE] =
	    (struct vsock_hdr){.src_cid = VSOCK_HOST_CID,
			       .dst_cid = v->guest_cid,
			       .src_port = local_port,
			       .dst_port = peer_port,
			       .type = VSOCK_TYPE_STREAM,
			       .op = VSOCK_OP_RST,
			       .buf_alloc = VSOCK_BUF_ALLOC};
}

/* RST to the guest and drop the connection with whatever it still buffers. */
static void conn_reset(struct virtio_vsock *v, struct vsock_conn *c)
{
	if (c->st == VSOCK_ST_CONNECTING || c->st == VSOCK_ST_ESTABLISHED)
		queue_rst(v, c->local_port, c->peer_port);
	conn_kill(v, c);
}

static struct vsock_conn *conn_find(struct virtio_vsock *v, uint32_t local, uint32_t peer)
{
	for (int i = 0; i < v->nr_conns; i++) {
		struct vsock_conn *c = v->conns[i];
		if (!c->zombie && (c->st == VSOCK_ST_CONNECTING || c->st == VSOCK_ST_ESTABLISHED) &&
		    c->local_port == local && c->peer_port == peer)
			return c;
	}
	return NULL;
}

/* After the guest->host buffer drained: apply the guest's half-close, or finish a close. */
static void conn_after_flush(struct virtio_vsock *v, struct vsock_conn *c)
{
	if (c->buf_len)
		return;
	if (c->st == VSOCK_ST_CLOSED) {
		conn_kill(v, c);
		return;
	}
	if ((c->guest_shut & VSOCK_SHUTDOWN_SEND) && !c->host_wr_shut) {
		shutdown(c->fd, SHUT_WR);
		c->host_wr_shut = true;
	}
}

/* Writes buffered guest bytes to the host socket. false when the connection was reset. */
static bool conn_flush(struct virtio_vsock *v, struct vsock_conn *c)
{
	c->tx_throttled = false;
	while (c->buf_len) {
		uint32_t chunk = c->buf_cap - c->buf_head;
		if (chunk > c->buf_len)
			chunk = c->buf_len;
		uint32_t allowed = rate_take(v, &c->tx_tb, chunk);
		if (!allowed) {
			c->tx_throttled = true; /* the rate timer flushes again */
			break;
		}
		ssize_t n = send(c->fd, c->buf + c->buf_head, allowed, MSG_NOSIGNAL | MSG_DONTWAIT);
		if ((uint32_t)(n > 0 ? n : 0) < allowed)
			tb_refund(&c->tx_tb, allowed - (uint32_t)(n > 0 ? n : 0));
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			break;
		if (n <= 0) {
			conn_reset(v, c);
			return false;
		}
		c->buf_head = (c->buf_head + (uint32_t)n) % c->buf_cap;
		c->buf_len -= (uint32_t)n;
		v->buffered -= (uint32_t)n;
		c->cr.fwd_cnt += (uint32_t)n;
	}
	if (!c->buf_len && c->buf) { /* only slow host readers hold a buffer */
		free(c->buf);
		c->buf = NULL;
		c->buf_head = 0;
	}
	if (vsock_credit_update_due(&c->cr) && c->st == VSOCK_ST_ESTABLISHED)
		c->need_credit = true;
	conn_after_flush(v, c);
	conn_watch(v, c);
	return true;
}

/* Guest payload for the host socket: straight through when possible, else buffered. */
static void conn_data(struct virtio_vsock *v, struct vsock_conn *c, const uint8_t *p, uint32_t len)
{
	if ((c->guest_shut & VSOCK_SHUTDOWN_SEND) || !vsock_credit_guest_sent(&c->cr, len)) {
		conn_reset(v, c); /* data after its own SHUTDOWN, or past the credit we gave */
		return;
	}
	uint32_t done = 0;
	uint32_t allowed = c->buf_len ? 0 : rate_take(v, &c->tx_tb, len);
	if (allowed) {
		ssize_t n = send(c->fd, p, allowed, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0 && errno != EAGAIN && errno != EINTR) {
			conn_reset(v, c);
			return;
		}
		if (n > 0) {
			done = (uint32_t)n;
			c->cr.fwd_cnt += done;
		}
		if (done < allowed)
			tb_refund(&c->tx_tb, allowed - done);
	}
	/* Out of tokens: what is left waits in the buffer, the guest's credit shrinks. */
	if (done < len && !c->buf_len && allowed < len)
		c->tx_throttled = true;
	if (done < len) {
		if (!c->buf) {
			if (!(c->buf = malloc(c->cr.buf_alloc))) {
				conn_reset(v, c);
				return;
			}
			c->buf_cap = c->cr.buf_alloc;
		}
		/* The credit check above keeps buf_len + rest within buf_alloc (== buf_cap). */
		for (uint32_t i = done; i < len; i++)
			c->buf[(c->buf_head + c->buf_len++) % c->buf_cap] = p[i];
		v->buffered += len - done;
	}
	if (vsock_credit_update_due(&c->cr))
		c->need_credit = true;
	conn_watch(v, c);
}

/* The guest connects to host port P: connect to "<uds_path>_P" or refuse with RST. */
static void guest_connect(struct virtio_vsock *v, const struct vsock_hdr *h)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int len = snprintf(sa.sun_path, sizeof(sa.sun_path), "%s_%u", v->uds_path, h->dst_port);
	if (len < 0 || (size_t)len >= sizeof(sa.sun_path) || v->nr_conns >= VSOCK_MAX_CONNS) {
		queue_rst(v, h->dst_port, h->src_port);
		return;
	}
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		log_debug(v->host->log, "vsock: guest port %u -> %s refused: %s", h->src_port,
			  sa.sun_path, strerror(errno));
		if (fd >= 0)
			close(fd);
		queue_rst(v, h->dst_port, h->src_port);
		return;
	}
	struct vsock_conn *c = conn_new(v, fd, VSOCK_ST_ESTABLISHED);
	if (!c) {
		close(fd);
		queue_rst(v, h->dst_port, h->src_port);
		return;
	}
	c->local_port = h->dst_port;
	c->peer_port = h->src_port;
	vsock_credit_update_from(&c->cr, h);
	c->need_response = true;
	conn_watch(v, c);
}

static void guest_shutdown(struct virtio_vsock *v, struct vsock_conn *c, uint32_t flags)
{
	c->guest_shut |= flags;
	if (c->guest_shut == (VSOCK_SHUTDOWN_RCV | VSOCK_SHUTDOWN_SEND)) {
		/* The guest closed: it waits for our RST.  Deliver what is buffered, then close. */
		queue_rst(v, c->local_port, c->peer_port);
		c->st = VSOCK_ST_CLOSED;
		c->need_credit = c->need_shutdown = false;
	}
	conn_after_flush(v, c);
	conn_watch(v, c);
}

static void tx_packet(struct virtio_vsock *v, const struct virtq *q, const struct virtq_chain *ch)
{
	uint8_t raw[VSOCK_HDR_SIZE];
	struct vsock_hdr h;
	if (ch->out_len < VSOCK_HDR_SIZE ||
	    virtq_chain_read(q, ch, 0, raw, sizeof(raw)) != sizeof(raw)) {
		v->bad_packets++;
		return;
	}
	vsock_hdr_decode(raw, &h);
	enum vsock_verdict vd = vsock_hdr_check(&h, v->guest_cid, ch->out_len - VSOCK_HDR_SIZE);
	if (vd != VSOCK_ACCEPT) {
		v->bad_packets++;
		if (vd == VSOCK_REPLY_RST)
			queue_rst(v, h.dst_port, h.src_port);
		return;
	}
	struct vsock_conn *c = conn_find(v, h.dst_port, h.src_port);
	if (!c) {
		if (h.op == VSOCK_OP_REQUEST)
			guest_connect(v, &h);
		else if (h.op != VSOCK_OP_RST)
			queue_rst(v, h.dst_port, h.src_port);
		return;
	}
	vsock_credit_update_from(&c->cr, &h);
	switch (vsock_conn_action(c->st, h.op)) {
	case VSOCK_ACT_NONE:
		break;
	case VSOCK_ACT_ESTABLISH: {
		char line[32];
		int n = snprintf(line, sizeof(line), "OK %u\n", c->local_port);
		if (send(c->fd, line, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) != n) {
			conn_reset(v, c);
			break;
		}
		c->st = VSOCK_ST_ESTABLISHED;
		break;
	}
	case VSOCK_ACT_DATA:
		if (h.len) {
			if (virtq_chain_read(q, ch, VSOCK_HDR_SIZE, v->bounce, h.len) != h.len) {
				conn_reset(v, c);
				break;
			}
			v->tx_bytes += h.len;
			conn_data(v, c, v->bounce, h.len);
		}
		break;
	case VSOCK_ACT_SHUTDOWN:
		log_debug(v->host->log, "vsock: guest shut down %u <-> host %u (flags %u)",
			  h.src_port, c->local_port, h.flags);
		guest_shutdown(v, c, h.flags);
		break;
	case VSOCK_ACT_SEND_CREDIT:
		c->need_credit = true;
		break;
	case VSOCK_ACT_CLOSE:
		conn_kill(v, c);
		break;
	case VSOCK_ACT_RST:
		log_debug(v->host->log, "vsock: guest reset %u <-> host %u (state %d)", h.src_port,
			  c->local_port, (int)c->st);
		conn_reset(v, c);
		break;
	}
	if (!c->zombie)
		conn_watch(v, c);
}

/* Writes `len` bytes at byte `off` of the chain's writable part. false when it does not fit. */
static bool chain_write(struct virtio_vsock *v, const struct virtq_chain *ch, uint64_t off,
			const void *data, uint64_t len)
{
	const uint8_t *p = data;
	for (uint32_t i = ch->nr_out; i < ch->nr && len; i++) {
		const struct virtq_seg *s = &ch->seg[i];
		if (off >= s->len) {
			off -= s->len;
			continue;
		}
		uint64_t k = s->len - off < len ? s->len - off : len;
		uint8_t *dst = guest_mem_ptr(v->mmio.mem, s->gpa + off, k);
		if (!dst)
			return false;
		memcpy(dst, p, k);
		virtio_mmio_mark_dirty(&v->mmio, s->gpa + off, k);
		p += k;
		len -= k;
		off = 0;
	}
	return len == 0;
}

/* Reads host socket bytes straight into the chain after the header. -errno, 0 at EOF, or bytes. */
static ssize_t chain_recv(struct virtio_vsock *v, const struct virtq_chain *ch, int fd,
			  uint64_t max)
{
	struct iovec iov[VIRTQ_MAX_SEGS];
	int n = 0;
	uint64_t skip = VSOCK_HDR_SIZE;
	for (uint32_t i = ch->nr_out; i < ch->nr && max; i++) {
		const struct virtq_seg *s = &ch->seg[i];
		if (skip >= s->len) {
			skip -= s->len;
			continue;
		}
		uint64_t k = s->len - skip < max ? s->len - skip : max;
		void *p = guest_mem_ptr(v->mmio.mem, s->gpa + skip, k);
		if (!p)
			return -EFAULT;
		iov[n++] = (struct iovec){.iov_base = p, .iov_len = k};
		max -= k;
		skip = 0;
	}
	if (!n)
		return -EFAULT;
	ssize_t r = readv(fd, iov, n);
	return r < 0 ? -errno : r;
}

/* Marks the payload bytes written by chain_recv dirty. */
static void chain_mark_payload(struct virtio_vsock *v, const struct virtq_chain *ch, uint64_t len)
{
	uint64_t skip = VSOCK_HDR_SIZE;
	for (uint32_t i = ch->nr_out; i < ch->nr && len; i++) {
		const struct virtq_seg *s = &ch->seg[i];
		if (skip >= s->len) {
			skip -= s->len;
			continue;
		}
		uint64_t k = s->len - skip < len ? s->len - skip : len;
		virtio_mmio_mark_dirty(&v->mmio, s->gpa + skip, k);
		len -= k;
		skip = 0;
	}
}

static bool conn_wants_read(const struct vsock_conn *c)
{
	return !c->zombie && c->st == VSOCK_ST_ESTABLISHED && c->readable && !c->host_eof &&
	       !(c->guest_shut & VSOCK_SHUTDOWN_RCV);
}

#define VSOCK_RESET_HOLD_NS (1000ULL * 1000 * 1000)

/* Whether host connection requests still wait for the guest to handle the reset event. */
static bool reset_holds(struct virtio_vsock *v)
{
	uint16_t avail;
	/* A buffer given back to the event queue: the guest has handled the reset. */
	if (v->reset_pending && virtq_avail_idx(&v->mmio.queues[EVQ], &avail) == 0 &&
	    avail != v->reset_avail) {
		v->reset_pending = false;
		log_debug(v->host->log, "vsock: the guest handled the transport reset");
	}
	/*
	 * The second counts from the first request held, not from the restore: the device is
	 * restored before the vCPUs start, and a slow start must not use up the guest's time.
	 * A timer pumps again when it is up.
	 */
	if (v->reset_pending && !v->reset_at_ns) {
		struct itimerspec its = {.it_value = {.tv_sec = 1, .tv_nsec = 1000000}};
		v->reset_at_ns = mono_ns();
		timerfd_settime(v->hold_tfd, 0, &its, NULL);
	}
	if (v->reset_pending && mono_ns() - v->reset_at_ns > VSOCK_RESET_HOLD_NS) {
		v->reset_pending = false; /* a guest that never kicks the event queue */
		log_debug(v->host->log, "vsock: the guest did not hand back the reset event "
					"within 1 s: held connection requests go");
	}
	return v->reset_pending;
}

/*
 * Fills the held rx chain with the next packet for the guest.  1 when it holds
 * a packet of *used bytes, 0 when there is nothing to send.
 */
static int rx_fill(struct virtio_vsock *v, uint32_t *used)
{
	const struct virtq_chain *ch = &v->rx_chain;
	uint8_t raw[VSOCK_HDR_SIZE];
	struct vsock_hdr h;
	if (v->rst_n) {
		h = v->rst_q[v->rst_head];
		v->rst_head = (v->rst_head + 1) % VSOCK_RST_QUEUE;
		v->rst_n--;
		goto send_hdr;
	}
	for (int k = 0; k < v->nr_conns; k++) {
		struct vsock_conn *c = v->conns[k];
		if (c->zombie)
			continue;
		if (c->need_request) {
			if (reset_holds(v))
				continue;
			c->need_request = false;
			h = host_hdr(v, c, VSOCK_OP_REQUEST);
			log_debug(v->host->log, "vsock: host %u -> guest port %u: request",
				  c->local_port, c->peer_port);
		} else if (c->need_response) {
			c->need_response = false;
			h = host_hdr(v, c, VSOCK_OP_RESPONSE);
		} else if (c->need_shutdown) {
			c->need_shutdown = false;
			h = host_hdr(v, c, VSOCK_OP_SHUTDOWN);
			h.flags = VSOCK_SHUTDOWN_SEND;
		} else if (c->need_credit) {
			c->need_credit = false;
			h = host_hdr(v, c, VSOCK_OP_CREDIT_UPDATE);
		} else {
			continue;
		}
		c->cr.last_fwd_sent = c->cr.fwd_cnt;
		goto send_hdr;
	}
	for (int k = 0; k < v->nr_conns; k++) {
		int i = (v->rr + k) % v->nr_conns;
		struct vsock_conn *c = v->conns[i];
		if (!conn_wants_read(c))
			continue;
		uint64_t max = vsock_credit_peer_avail(&c->cr);
		if (max > VSOCK_MAX_PAYLOAD)
			max = VSOCK_MAX_PAYLOAD;
		if (max > ch->in_len - VSOCK_HDR_SIZE)
			max = ch->in_len - VSOCK_HDR_SIZE;
		if (!max)
			continue; /* no credit: wait for the guest's CREDIT_UPDATE */
		uint32_t allowed = rate_take(v, &c->rx_tb, (uint32_t)max);
		if (!allowed)
			continue; /* out of tokens: the rate timer pumps again */
		max = allowed;
		ssize_t n = chain_recv(v, ch, c->fd, max);
		if ((uint64_t)(n > 0 ? n : 0) < max)
			tb_refund(&c->rx_tb, max - (uint64_t)(n > 0 ? n : 0));
		if (n == -EFAULT)
			return -1; /* the guest's buffer, not the connection, is bad */
		if (n == -EAGAIN || n == -EINTR) {
			c->readable = false;
			conn_watch(v, c);
			continue;
		}
		if (n == 0) {
			/* The host half-closed: the guest reads EOF after the data it has. */
			c->host_eof = true;
			h = host_hdr(v, c, VSOCK_OP_SHUTDOWN);
			h.flags = VSOCK_SHUTDOWN_SEND;
			c->cr.last_fwd_sent = c->cr.fwd_cnt;
			conn_watch(v, c);
			goto send_hdr;
		}
		if (n < 0) {
			conn_reset(v, c);
			continue;
		}
		chain_mark_payload(v, ch, (uint64_t)n);
		h = host_hdr(v, c, VSOCK_OP_RW);
		h.len = (uint32_t)n;
		c->cr.tx_cnt += (uint32_t)n;
		c->cr.last_fwd_sent = c->cr.fwd_cnt;
		v->rx_bytes += (uint64_t)n;
		v->rr = (i + 1) % v->nr_conns;
		vsock_hdr_encode(&h, raw);
		if (!chain_write(v, ch, 0, raw, sizeof(raw)))
			return -1;
		*used = VSOCK_HDR_SIZE + (uint32_t)n;
		return 1;
	}
	return 0;
send_hdr:
	vsock_hdr_encode(&h, raw);
	if (!chain_write(v, ch, 0, raw, sizeof(raw)))
		return -1;
	*used = VSOCK_HDR_SIZE;
	return 1;
}

/* Moves pending packets into the guest's rx buffers while it has some. */
static void rx_pump(struct virtio_vsock *v)
{
	struct virtio_mmio *t = &v->mmio;
	struct virtq *q = &t->queues[RXQ];
	if (!(t->status & VIRTIO_STATUS_DRIVER_OK) || (t->status & VIRTIO_STATUS_NEEDS_RESET) ||
	    !q->ready)
		return;
	bool pushed = false;
	for (uint32_t n = 0;; n++) {
		if (n == VIRTIO_NOTIFY_BUDGET) {
			virtio_mmio_defer(t, RXQ); /* more may be waiting: after the other fds */
			break;
		}
		if (!v->rx_held) {
			int r = virtq_pop(q, &v->rx_chain);
			if (r == 0)
				break;
			if (r < 0) {
				virtio_mmio_set_needs_reset(t);
				break;
			}
			if (v->rx_chain.in_len < VSOCK_HDR_SIZE) {
				v->bad_packets++;
				virtq_push(q, v->rx_chain.head, 0);
				pushed = true;
				continue;
			}
			v->rx_held = true;
		}
		uint32_t used = 0;
		int r = rx_fill(v, &used);
		if (r == 0)
			break;
		if (r < 0) { /* a buffer outside guest RAM */
			v->bad_packets++;
			used = 0;
		}
		virtq_push(q, v->rx_chain.head, used);
		v->rx_held = false;
		pushed = true;
	}
	if (pushed)
		virtio_mmio_notify_used(t, RXQ);
}

static void tx_drain(struct virtio_vsock *v)
{
	struct virtio_mmio *t = &v->mmio;
	struct virtq *q = &t->queues[TXQ];
	bool pushed = false;
	for (uint32_t n = 0;; n++) {
		if (n == VIRTIO_NOTIFY_BUDGET) {
			virtio_mmio_defer(t, TXQ);
			break;
		}
		int r = virtq_pop(q, &v->tx_chain);
		if (r == 0)
			break;
		if (r < 0) {
			virtio_mmio_set_needs_reset(t);
			break;
		}
		tx_packet(v, q, &v->tx_chain);
		virtq_push(q, v->tx_chain.head, 0);
		pushed = true;
	}
	if (pushed)
		virtio_mmio_notify_used(t, TXQ);
}

static void queue_notify(void *dev, struct virtio_mmio *t, uint32_t q)
{
	struct virtio_vsock *v = dev;
	(void)t;
	if (q == TXQ)
		tx_drain(v);
	/*
	 * An event queue notify may be the guest giving the reset event's buffer back: the pump
	 * sees it (reset_holds looks at the queue's avail index; a kick of our own, as when the
	 * transport re-checks its queues on resume, does not move it).
	 */
	/* New rx buffers, or tx made replies, or held requests may go: try to deliver. */
	rx_pump(v);
	sweep(v);
}

static void dev_reset(void *dev)
{
	struct virtio_vsock *v = dev;
	for (int i = 0; i < v->nr_conns; i++)
		conn_kill(v, v->conns[i]);
	sweep(v);
	v->rst_n = v->rst_head = 0;
	v->rx_held = false;
	v->reset_pending = false;
}

static void host_accept(struct virtio_vsock *v)
{
	for (;;) {
		int fd = accept4(v->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			/* EMFILE & co. would keep the level-triggered listen fd firing: pause it.
			 */
			if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				listen_watch(v, false);
			return;
		}
		if (!conn_new(v, fd, VSOCK_ST_HOST_HANDSHAKE))
			close(fd);
	}
}

/* Reads the "CONNECT <port>\n" line byte by byte so no data after it is taken early. */
static void host_handshake(struct virtio_vsock *v, struct vsock_conn *c)
{
	for (;;) {
		char ch;
		ssize_t n = recv(c->fd, &ch, 1, MSG_DONTWAIT);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		if (n <= 0 || c->line_len >= sizeof(c->line)) {
			conn_kill(v, c);
			return;
		}
		c->line[c->line_len++] = ch;
		uint32_t port;
		int r = vsock_parse_connect(c->line, c->line_len, &port);
		if (r < 0) {
			conn_kill(v, c);
			return;
		}
		if (r == 1) {
			c->st = VSOCK_ST_CONNECTING;
			c->local_port = v->next_local_port++;
			if (v->next_local_port < FIRST_LOCAL_PORT)
				v->next_local_port = FIRST_LOCAL_PORT;
			c->peer_port = port;
			c->need_request = true;
			conn_watch(v, c);
			return;
		}
	}
}

/* The rate timer's time has come: flush throttled buffers (the pump after it does rx). */
static void rate_due(struct virtio_vsock *v)
{
	if (!v->rate_deadline_ns || vnow(v) < v->rate_deadline_ns)
		return;
	v->rate_deadline_ns = 0;
	for (int i = 0; i < v->nr_conns; i++) {
		struct vsock_conn *c = v->conns[i];
		if (!c->zombie && c->tx_throttled)
			conn_flush(v, c); /* re-arms the timer when tokens run out again */
	}
}

void virtio_vsock_service(struct virtio_vsock *v)
{
	pthread_mutex_lock(&v->mmio.lock);
	struct epoll_event evs[64];
	int n = epoll_wait(v->epfd, evs, 64, 0);
	for (int i = 0; i < n; i++) {
		struct vsock_conn *c = evs[i].data.ptr;
		uint32_t e = evs[i].events;
		if (evs[i].data.ptr == &v->rate_tfd) {
			uint64_t ticks;
			if (read(v->rate_tfd, &ticks, sizeof(ticks)) < 0) {
				/* EAGAIN: already read; rate_due below looks at the clock */
			}
			continue;
		}
		if (evs[i].data.ptr == &v->hold_tfd) {
			uint64_t ticks;
			if (read(v->hold_tfd, &ticks, sizeof(ticks)) < 0) {
				/* EAGAIN: already read; the pump below looks anyway */
			}
			continue;
		}
		if (!c) {
			host_accept(v);
			continue;
		}
		if (c->zombie)
			continue;
		if (c->st == VSOCK_ST_HOST_HANDSHAKE) {
			host_handshake(v, c);
			continue;
		}
		if ((e & EPOLLOUT) && !conn_flush(v, c))
			continue;
		if (e & (EPOLLIN | EPOLLHUP | EPOLLERR))
			c->readable = true;
		if ((e & (EPOLLHUP | EPOLLERR)) && !c->zombie) {
			/* Level-triggered HUP would fire forever: stop watching, reads tell the
			 * rest. */
			if (c->registered)
				epoll_ctl(v->epfd, EPOLL_CTL_DEL, c->fd, NULL);
			c->registered = false;
			c->hup = true;
			if (c->st == VSOCK_ST_CLOSED || c->host_eof ||
			    (c->guest_shut & VSOCK_SHUTDOWN_RCV) || c->st == VSOCK_ST_CONNECTING)
				conn_reset(v, c);
			continue;
		}
		conn_watch(v, c);
	}
	rate_due(v);
	rx_pump(v);
	sweep(v);
	pthread_mutex_unlock(&v->mmio.lock);
}

static void on_sockets(void *opaque, uint32_t events)
{
	(void)events;
	virtio_vsock_service(opaque);
}

static const struct virtio_dev_ops vsock_ops = {
    .name = "virtio-vsock",
    .device_id = VIRTIO_ID_VSOCK,
    .features = VIRTIO_F_RING_EVENT_IDX,
    .nr_queues = 3,
    .config_size = 8,
    .config_read = config_read,
    .queue_notify = queue_notify,
    .reset = dev_reset,
};

/*
 * Listens on `path` with mode 0600 whatever the umask. The mode of a socket file is fixed at
 * bind() from the umask (fchmod() on the socket does not reach the file), and changing the
 * umask is process-wide, not thread-safe. So bind in a fresh 0700 directory next to `path`,
 * where nobody else can reach the socket, chmod it there, listen, and rename it into place:
 * it is never reachable at `path` with any other mode.
 */
static int listen_uds(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	char dir[sizeof(sa.sun_path)];
	if (snprintf(dir, sizeof(dir), "%s.XXXXXX", path) >= (int)sizeof(dir) - 2)
		return -ENAMETOOLONG;
	struct stat st;
	/* A socket left by an earlier run is stale; any other file is not ours to replace. */
	if (lstat(path, &st) == 0 && !S_ISSOCK(st.st_mode))
		return -EEXIST;
	if (!mkdtemp(dir))
		return -errno;
	int n = snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/s", dir);
	if (n < 0 || (size_t)n >= sizeof(sa.sun_path)) { /* the check above leaves room */
		rmdir(dir);
		return -ENAMETOOLONG;
	}
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	int r = fd < 0 ? -errno : 0;
	if (!r && (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || chmod(sa.sun_path, 0600) ||
		   listen(fd, 128) || rename(sa.sun_path, path)))
		r = -errno;
	if (r) {
		unlink(sa.sun_path);
		if (fd >= 0)
			close(fd);
	}
	rmdir(dir);
	return r ? r : fd;
}

static uint64_t mono_clock(void *ctx)
{
	(void)ctx;
	return mono_ns();
}

int virtio_vsock_create(struct virtio_vsock *v, const struct vm_host *host, uint64_t guest_cid,
			const char *uds_path, uint64_t base, uint32_t irq)
{
	memset(v, 0, sizeof(*v));
	v->host = host;
	v->guest_cid = guest_cid;
	v->next_local_port = FIRST_LOCAL_PORT;
	v->listen_fd = v->epfd = v->hold_tfd = v->rate_tfd = -1;
	v->clock_ns = mono_clock;
	if (guest_cid < VSOCK_MIN_CID || guest_cid > UINT32_MAX ||
	    strlen(uds_path) + 12 > sizeof(v->uds_path)) {
		log_err(host->log, "vsock: bad cid %llu or socket path too long",
			(unsigned long long)guest_cid);
		return -EINVAL;
	}
	strcpy(v->uds_path, uds_path);
	int r = listen_uds(uds_path);
	if (r < 0) {
		log_err(host->log, "vsock: cannot listen on %s: %s", uds_path, strerror(-r));
		return r;
	}
	v->listen_fd = r;
	v->epfd = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
	v->hold_tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	struct epoll_event tev = {.events = EPOLLIN, .data.ptr = &v->hold_tfd};
	v->rate_tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	struct epoll_event rev = {.events = EPOLLIN, .data.ptr = &v->rate_tfd};
	if (v->epfd < 0 || v->hold_tfd < 0 || v->rate_tfd < 0 ||
	    epoll_ctl(v->epfd, EPOLL_CTL_ADD, v->listen_fd, &ev) ||
	    epoll_ctl(v->epfd, EPOLL_CTL_ADD, v->hold_tfd, &tev) ||
	    epoll_ctl(v->epfd, EPOLL_CTL_ADD, v->rate_tfd, &rev)) {
		r = -errno;
		log_err(host->log, "vsock: epoll: %s", strerror(-r));
		goto fail_fds;
	}
	r = virtio_mmio_create(&v->mmio, host, base, irq, &vsock_ops, v);
	if (r)
		goto fail_fds;
	r = evloop_add(host->loop, v->epfd, EPOLLIN, on_sockets, v);
	if (r) {
		log_err(host->log, "vsock: cannot watch sockets: %s", strerror(-r));
		goto fail_mmio;
	}
	v->watched = true;
	log_info(host->log, "vsock: cid %llu, host socket %s at 0x%llx irq %u",
		 (unsigned long long)guest_cid, uds_path, (unsigned long long)base, irq);
	return 0;
fail_mmio:
	virtio_mmio_destroy(&v->mmio);
fail_fds:
	if (v->epfd >= 0)
		close(v->epfd);
	if (v->hold_tfd >= 0)
		close(v->hold_tfd);
	if (v->rate_tfd >= 0)
		close(v->rate_tfd);
	close(v->listen_fd);
	unlink(uds_path);
	return r;
}

void virtio_vsock_destroy(struct virtio_vsock *v)
{
	if (v->watched)
		evloop_del(v->host->loop, v->epfd);
	v->watched = false;
	for (int i = 0; i < v->nr_conns; i++)
		conn_kill(v, v->conns[i]);
	sweep(v);
	virtio_mmio_destroy(&v->mmio);
	close(v->epfd);
	close(v->hold_tfd);
	close(v->rate_tfd);
	close(v->listen_fd);
	unlink(v->uds_path);
}

int virtio_vsock_set_rate(struct virtio_vsock *v, uint64_t rate)
{
	if (rate > TB_MAX_TOKENS) {
		log_err(v->host->log, "vsock: rate %llu bytes/s is over the cap",
			(unsigned long long)rate);
		return -EINVAL;
	}
	pthread_mutex_lock(&v->mmio.lock);
	v->rate = rate;
	pthread_mutex_unlock(&v->mmio.lock);
	if (rate)
		log_info(v->host->log, "vsock: %llu bytes/s per connection each way",
			 (unsigned long long)rate);
	return 0;
}

void virtio_vsock_save(struct virtio_vsock *v, struct virtio_mmio_state *st)
{
	virtio_mmio_save(&v->mmio, st);
	pthread_mutex_lock(&v->mmio.lock);
	if (v->rx_held)
		st->q[RXQ].last_avail--;
	pthread_mutex_unlock(&v->mmio.lock);
}

#define VIRTIO_VSOCK_EVENT_TRANSPORT_RESET 0

int virtio_vsock_restored(struct virtio_vsock *v)
{
	struct virtio_mmio *t = &v->mmio;
	int r = 0;
	pthread_mutex_lock(&t->lock);
	struct virtq *q = &t->queues[EVQ];
	if (!q->ready || !(t->status & VIRTIO_STATUS_DRIVER_OK))
		goto out; /* no driver yet: nothing to reset */
	r = virtq_pop(q, &v->tx_chain);
	if (r <= 0) {
		r = r ? r : -ENOSPC;
		goto out;
	}
	uint8_t ev[4] = {VIRTIO_VSOCK_EVENT_TRANSPORT_RESET, 0, 0, 0};
	bool ok = chain_write(v, &v->tx_chain, 0, ev, sizeof(ev));
	virtq_push(q, v->tx_chain.head, ok ? sizeof(ev) : 0);
	v->reset_pending = ok && virtq_avail_idx(q, &v->reset_avail) == 0;
	if (v->reset_pending)
		(void)virtq_notify_on_next_avail(q); /* so that the refill is a notify we see */
	v->reset_at_ns = 0; /* counted from the first request it holds (reset_holds) */
	log_debug(t->host->log, "vsock: transport reset event %s", ok ? "sent" : "not sent");
	virtio_mmio_notify_used(t, EVQ);
	r = ok ? 0 : -EFAULT;
out:
	pthread_mutex_unlock(&t->lock);
	return r;
}

static int vsock_type_create(void *dev, const struct device_host *h, const void *cfg)
{
	const struct virtio_vsock_cfg *c = cfg;
	int r = virtio_vsock_create(dev, h->host, c->cid, c->uds_path, h->mmio_base, h->irq);
	if (!r && (r = virtio_vsock_set_rate(dev, c->rate)))
		virtio_vsock_destroy(dev);
	return r;
}

static void vsock_type_destroy(void *dev)
{
	virtio_vsock_destroy(dev);
}

static struct virtio_mmio *vsock_type_mmio(void *dev)
{
	return &((struct virtio_vsock *)dev)->mmio;
}

static void vsock_type_save_mmio(void *dev, struct virtio_mmio_state *st)
{
	virtio_vsock_save(dev, st);
}

static void vsock_type_resumed(void *dev, struct logger *log)
{
	int r = virtio_vsock_restored(dev);
	if (r)
		log_warn(log, "vsock: could not tell the guest its connections were reset: %s",
			 strerror(-r));
}

/* vsock keeps its --vsock-cid/--vsock-uds options and "vsock" machine config key. */
const struct device_type virtio_vsock_type = {
    .name = "virtio-vsock",
    .size = sizeof(struct virtio_vsock),
    .create = vsock_type_create,
    .destroy = vsock_type_destroy,
    .mmio = vsock_type_mmio,
    .save_mmio = vsock_type_save_mmio,
    .resumed = vsock_type_resumed,
};
