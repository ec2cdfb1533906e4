/* The egress byte relay: one poll loop over the two sockets of a connection (and the stop
 * eventfd), a fixed buffer per direction, so memory per connection is bounded. */
#include "egress_relay.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/socket.h>

struct dir {
	int src, dst;
	char *buf;
	size_t len, off;
	bool eof;  /* src sent everything */
	bool shut; /* dst's sending side shut down */
	uint64_t *count;
	const char *src_reset;
};

/* Reads what src has (never more than the cap allows plus one byte, to see it pass).
 * Returns NULL to go on or why the relay ends. */
static const char *dir_read(struct dir *d, uint64_t max_bytes)
{
	size_t room = EGRESS_RELAY_BUF;
	ssize_t n;

	if (max_bytes - *d->count < room)
		room = (size_t)(max_bytes - *d->count) + 1;
	n = recv(d->src, d->buf, room, MSG_DONTWAIT);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return NULL;
	if (n < 0)
		return d->src_reset;
	if (n == 0) {
		d->eof = true;
		return NULL;
	}
	if ((uint64_t)n > max_bytes - *d->count)
		return "over max_bytes";
	*d->count += (uint64_t)n;
	d->len = (size_t)n;
	d->off = 0;
	return NULL;
}

static const char *dir_write(struct dir *d, const char *dst_reset)
{
	ssize_t n = send(d->dst, d->buf + d->off, d->len - d->off, MSG_DONTWAIT | MSG_NOSIGNAL);

	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return NULL;
	if (n < 0)
		return dst_reset;
	d->off += (size_t)n;
	if (d->off == d->len)
		d->off = d->len = 0;
	return NULL;
}

/* Once src ended and everything it sent went out, the far side hears the end too. */
static void dir_maybe_shut(struct dir *d)
{
	if (d->eof && !d->len && !d->shut) {
		shutdown(d->dst, SHUT_WR);
		d->shut = true;
	}
}

const char *egress_relay(int guest, int upstream, int stop_fd, int idle_ms, uint64_t max_bytes,
			 struct relay_stats *st)
{
	struct dir dirs[2] = {
	    {.src = guest, .dst = upstream, .count = &st->up, .src_reset = "guest reset"},
	    {.src = upstream, .dst = guest, .count = &st->down, .src_reset = "upstream reset"}};
	const char *resets[2] = {"upstream reset", "guest reset"};
	const char *why = NULL;
	char *mem = malloc(2 * EGRESS_RELAY_BUF);

	if (!mem)
		return "out of memory";
	dirs[0].buf = mem;
	dirs[1].buf = mem + EGRESS_RELAY_BUF;
	while (!why && !(dirs[0].shut && dirs[1].shut)) {
		struct pollfd p[3] = {
		    {.fd = guest}, {.fd = upstream}, {.fd = stop_fd, .events = POLLIN}};
		int n;

		for (int i = 0; i < 2; i++) {
			struct dir *d = &dirs[i];

			if (d->len)
				p[d->dst == guest ? 0 : 1].events |= POLLOUT;
			else if (!d->eof)
				p[d->src == guest ? 0 : 1].events |= POLLIN;
		}
		/* A side we wait on only to drain our full buffer is left out, so its hang-up
		 * cannot wake every poll before the other side takes the bytes. */
		for (int i = 0; i < 2; i++)
			if (!p[i].events && !dirs[i].eof)
				p[i].fd = -1;
		n = poll(p, 3, idle_ms);
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
		for (int i = 0; i < 2 && !why; i++) {
			struct dir *d = &dirs[i];
			struct pollfd *ps = &p[d->src == guest ? 0 : 1];
			struct pollfd *pd = &p[d->dst == guest ? 0 : 1];

			if (d->len && (pd->revents & (POLLOUT | POLLERR | POLLHUP)))
				why = dir_write(d, resets[i]);
			else if (!d->len && !d->eof && (ps->revents & (POLLIN | POLLERR | POLLHUP)))
				why = dir_read(d, max_bytes);
			if (!why)
				dir_maybe_shut(d);
		}
		/* A socket that already sent its end and now hung up cannot take what the other
		 * side still sends (and would wake every poll): nothing more can pass. */
		for (int i = 0; i < 2 && !why; i++)
			if ((p[i].revents & (POLLHUP | POLLERR)) && dirs[i].eof &&
			    !(dirs[0].shut && dirs[1].shut))
				why = "closed";
	}
	free(mem);
	return why ? why : "closed";
}
