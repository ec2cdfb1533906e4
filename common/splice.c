/* Two connected streams spliced both ways, a bounded buffer per direction, half-closes kept. */
#include "common/splice.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#define RELAY_CHUNK 65536

/* One direction: bytes read from `from` wait in buf[off..len) until `to` takes them. */
struct relay_dir {
	int from, to;
	char *buf;
	size_t off, len;
	bool eof;  /* `from` sent EOF */
	bool done; /* nothing more goes this way */
};

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

/* Writes what is buffered; 0 (all or part written, or not writable yet) or -errno. */
static int dir_flush(struct relay_dir *d)
{
	while (d->off < d->len) {
		ssize_t n = send(d->to, d->buf + d->off, d->len - d->off, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
		d->off += (size_t)n;
	}
	d->off = d->len = 0;
	return 0;
}

/* Reads into the (empty) buffer; 0 or -errno. */
static int dir_fill(struct relay_dir *d)
{
	for (;;) {
		ssize_t n = read(d->from, d->buf, RELAY_CHUNK);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
		if (n == 0)
			d->eof = true;
		d->off = 0;
		d->len = (size_t)n;
		return 0;
	}
}

/* After reads and writes: a drained direction whose source ended passes the EOF on. */
static void dir_settle(struct relay_dir *d)
{
	if (!d->done && d->eof && d->off == d->len) {
		shutdown(d->to, SHUT_WR);
		d->done = true;
	}
}

int fd_splice(int a, int b)
{
	struct relay_dir d[2] = {{.from = a, .to = b}, {.from = b, .to = a}};
	int fds[2] = {a, b};
	int ret;

	ret = set_nonblock(a);
	if (ret == 0)
		ret = set_nonblock(b);
	if (ret < 0)
		return ret;
	d[0].buf = malloc(RELAY_CHUNK);
	d[1].buf = malloc(RELAY_CHUNK);
	if (!d[0].buf || !d[1].buf) {
		ret = -ENOMEM;
		goto out;
	}
	while (!d[0].done || !d[1].done) {
		struct pollfd p[2];

		/* fds[i] is d[i].from and d[1 - i].to. An fd with nothing to wait for is left out:
		 * poll reports POLLHUP and POLLERR even unasked, which would spin. */
		for (int i = 0; i < 2; i++) {
			short ev = 0;

			if (!d[i].done && !d[i].eof && d[i].len == 0)
				ev |= POLLIN;
			if (!d[1 - i].done && d[1 - i].off < d[1 - i].len)
				ev |= POLLOUT;
			p[i].fd = ev ? fds[i] : -1;
			p[i].events = ev;
			p[i].revents = 0;
		}
		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			ret = -errno;
			break;
		}
		for (int i = 0; i < 2 && ret == 0; i++) {
			struct relay_dir *in = &d[i], *out = &d[1 - i];

			if (!p[i].revents)
				continue;
			/* fds[i] may take what waits for it (out) and give more (in); the two
			 * directions never share a buffer. */
			if ((p[i].events & POLLOUT) && dir_flush(out) < 0) {
				/* The peer takes no more: this way is over, the other goes on. */
				out->done = true;
				out->off = out->len = 0;
			}
			if ((p[i].events & POLLIN) && !in->done)
				ret = dir_fill(in);
		}
		if (ret < 0)
			break; /* a reset: nothing more will come either way */
		/* A fresh read is written at once when it can be (saves a poll round trip). */
		for (int i = 0; i < 2; i++) {
			if (!d[i].done && d[i].off < d[i].len && dir_flush(&d[i]) < 0) {
				d[i].done = true;
				d[i].off = d[i].len = 0;
			}
			dir_settle(&d[i]);
		}
	}
out:
	free(d[0].buf);
	free(d[1].buf);
	return ret;
}
