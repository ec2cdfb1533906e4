/* The epoll event loop: one thread serves the control socket, console input and device fds. */
#ifndef COVE_EVLOOP_H
#define COVE_EVLOOP_H

#include <stdbool.h>
#include <stdint.h>

#define EVLOOP_MAX_HANDLERS 64

/* Called on the loop thread with the epoll events that fired. */
typedef void (*evloop_cb)(void *opaque, uint32_t events);

struct evloop_handler {
	int fd;
	evloop_cb cb;
	void *opaque;
	bool used;
};

struct evloop {
	int epfd;
	bool stop;
	struct evloop_handler handlers[EVLOOP_MAX_HANDLERS];
};

int evloop_init(struct evloop *loop);
void evloop_destroy(struct evloop *loop);
/* Watches `fd` for `events` (EPOLLIN...). Returns 0 or -errno (-ENOSPC when full). */
int evloop_add(struct evloop *loop, int fd, uint32_t events, evloop_cb cb, void *opaque);
int evloop_del(struct evloop *loop, int fd);
/* Runs until evloop_stop() is called from a callback. timeout_ms < 0 blocks. */
int evloop_run(struct evloop *loop);
/* Runs one round of at most one epoll_wait; returns number of events or -errno. */
int evloop_run_once(struct evloop *loop, int timeout_ms);
void evloop_stop(struct evloop *loop);

#endif
