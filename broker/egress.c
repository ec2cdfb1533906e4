/* The egress server: an accept thread on the egress socket, a detached thread per connection
 * (small stack, every signal blocked so SIGTERM still reaches the event loop's signalfd), a
 * count capped by the policy's max_connections, and a stop eventfd every thread polls. */
#include "egress.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

struct egress_server {
	struct broker *b;
	int lfd, stop_fd;
	pthread_t acceptor;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint32_t active; /* connection threads alive */
};

struct conn_arg {
	struct egress_server *s;
	int fd;
};

static void conn_done(struct egress_server *s)
{
	pthread_mutex_lock(&s->mu);
	s->active--;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

static void *conn_main(void *arg)
{
	struct conn_arg a = *(struct conn_arg *)arg;

	free(arg);
	egress_serve(a.s->b, a.fd, a.s->stop_fd);
	close(a.fd);
	conn_done(a.s);
	return NULL;
}

/* A thread for fd, or -errno (the caller refuses it). */
static int spawn(struct egress_server *s, int fd)
{
	struct conn_arg *a = malloc(sizeof(*a));
	pthread_attr_t at;
	pthread_t t;
	int r;

	if (!a)
		return -ENOMEM;
	a->s = s;
	a->fd = fd;
	if ((r = pthread_attr_init(&at))) {
		free(a);
		return -r;
	}
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&at, EGRESS_THREAD_STACK);
	r = pthread_create(&t, &at, conn_main, a);
	pthread_attr_destroy(&at);
	if (r)
		free(a);
	return -r;
}

static void accept_one(struct egress_server *s)
{
	const struct egress_policy *pol = &s->b->pol.egress;
	int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC), r;
	char why[96];
	bool full;

	if (fd < 0)
		return;
	pthread_mutex_lock(&s->mu);
	full = s->active >= pol->max_connections;
	if (!full)
		s->active++;
	pthread_mutex_unlock(&s->mu);
	if (full) {
		snprintf(why, sizeof(why), "over max_connections (%u open)", pol->max_connections);
		egress_refuse(s->b, fd, 503, why);
		close(fd);
		return;
	}
	r = spawn(s, fd);
	if (r) {
		conn_done(s);
		snprintf(why, sizeof(why), "cannot start a connection thread: %s", strerror(-r));
		egress_refuse(s->b, fd, 503, why);
		close(fd);
	}
}

static void *accept_main(void *arg)
{
	struct egress_server *s = arg;

	for (;;) {
		struct pollfd p[2] = {{.fd = s->lfd, .events = POLLIN},
				      {.fd = s->stop_fd, .events = POLLIN}};

		if (poll(p, 2, -1) < 0 && errno != EINTR)
			break;
		if (p[1].revents)
			break;
		if (p[0].revents & POLLIN)
			accept_one(s);
	}
	return NULL;
}

int egress_start(struct broker *b, int listen_fd, struct egress_server **out)
{
	struct egress_server *s = calloc(1, sizeof(*s));
	sigset_t all, old;
	int r;

	if (!s)
		return -ENOMEM;
	s->b = b;
	s->lfd = listen_fd;
	s->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (s->stop_fd < 0) {
		r = -errno;
		free(s);
		return r;
	}
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	/* Threads inherit this mask: signals stay with the main thread's signalfd. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	r = -pthread_create(&s->acceptor, NULL, accept_main, s);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r) {
		close(s->stop_fd);
		pthread_mutex_destroy(&s->mu);
		pthread_cond_destroy(&s->cv);
		free(s);
		return r;
	}
	*out = s;
	return 0;
}

void egress_stop(struct egress_server *s)
{
	uint64_t one = 1;

	if (!s)
		return;
	/* Never read: the eventfd stays readable, so every poll on it returns from now on. */
	if (write(s->stop_fd, &one, sizeof(one)) != sizeof(one))
		broker_log(s->b, LOG_ERROR, "egress: stop: %s", strerror(errno));
	pthread_join(s->acceptor, NULL);
	pthread_mutex_lock(&s->mu);
	while (s->active)
		pthread_cond_wait(&s->cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
	close(s->stop_fd);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	free(s);
}
