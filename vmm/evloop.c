/* The epoll event loop: a fixed table of fd handlers dispatched from one thread. */
#include "vmm/evloop.h"

#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

int evloop_init(struct evloop *loop)
{
	memset(loop, 0, sizeof(*loop));
	loop->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (loop->epfd < 0)
		return -errno;
	return 0;
}

void evloop_destroy(struct evloop *loop)
{
	if (loop->epfd >= 0)
		close(loop->epfd);
	loop->epfd = -1;
}

int evloop_add(struct evloop *loop, int fd, uint32_t events, evloop_cb cb, void *opaque)
{
	int slot = -1;
	for (int i = 0; i < EVLOOP_MAX_HANDLERS; i++) {
		if (!loop->handlers[i].used) {
			slot = i;
			break;
		}
	}
	if (slot < 0)
		return -ENOSPC;
	struct epoll_event ev = { .events = events, .data.u32 = (uint32_t)slot };
	if (epoll_ctl(loop->epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
		return -errno;
	loop->handlers[slot] = (struct evloop_handler){ .fd = fd, .cb = cb, .opaque = opaque, .used = true };
	return 0;
}

int evloop_del(struct evloop *loop, int fd)
{
	for (int i = 0; i < EVLOOP_MAX_HANDLERS; i++) {
		if (loop->handlers[i].used && loop->handlers[i].fd == fd) {
			loop->handlers[i].used = false;
			if (epoll_ctl(loop->epfd, EPOLL_CTL_DEL, fd, NULL) < 0)
				return -errno;
			return 0;
		}
	}
	return -ENOENT;
}

int evloop_run_once(struct evloop *loop, int timeout_ms)
{
	struct epoll_event evs[16];
	int n = epoll_wait(loop->epfd, evs, 16, timeout_ms);
	if (n < 0)
		return errno == EINTR ? 0 : -errno;
	for (int i = 0; i < n; i++) {
		uint32_t slot = evs[i].data.u32;
		/* A callback earlier in this batch may have removed this handler. */
		if (slot >= EVLOOP_MAX_HANDLERS || !loop->handlers[slot].used)
			continue;
		struct evloop_handler h = loop->handlers[slot];
		h.cb(h.opaque, evs[i].events);
	}
	return n;
}

int evloop_run(struct evloop *loop)
{
	while (!loop->stop) {
		int r = evloop_run_once(loop, -1);
		if (r < 0)
			return r;
	}
	return 0;
}

void evloop_stop(struct evloop *loop)
{
	loop->stop = true;
}
