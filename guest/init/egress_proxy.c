/* egress_proxy.c: 127.0.0.1:3128 in the guest, each connection relayed to vsock CID 2 port 1026. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <linux/vm_sockets.h>

#include "common/splice.h"
#include "egress_proxy.h"

/* A relay keeps its buffers on the heap; 256 of them must not reserve 8 MiB of stack each. */
#define RELAY_STACK (256 * 1024)

struct relay {
	struct egress_proxy *p;
	int fd;
};

/* The host side: vsock CID 2 port 1026, or what cove makes of it outside a VM, PATH_1026. */
static int upstream_connect(const struct egress_proxy *p)
{
	struct sockaddr_vm vm = {
	    .svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_HOST, .svm_port = EGRESS_HOST_PORT};
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	struct sockaddr *sa = (struct sockaddr *)&vm;
	socklen_t salen = sizeof(vm);
	int fd, n;

	if (p->test_uds) {
		n = snprintf(sun.sun_path, sizeof(sun.sun_path), "%s_%d", p->test_uds,
			     EGRESS_HOST_PORT);
		if (n < 0 || (size_t)n >= sizeof(sun.sun_path))
			return -ENAMETOOLONG;
		sa = (struct sockaddr *)&sun;
		salen = sizeof(sun);
	}
	fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	/* Linux gives up on a vsock connect after 2 s; a host busy with many streams may answer
	 * later than that (50 downloads at once lost some), so wait as long as a TCP connect. */
	if (!p->test_uds) {
		struct timeval tv = {.tv_sec = VSOCK_CONNECT_TIMEOUT_S};

		(void)setsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_CONNECT_TIMEOUT, &tv, sizeof(tv));
	}
	while (connect(fd, sa, salen) < 0) {
		int e = errno;

		if (e == EINTR)
			continue;
		close(fd);
		return -e;
	}
	return fd;
}

static void relay_end(struct egress_proxy *p)
{
	pthread_mutex_lock(&p->lock);
	if (--p->active == 0)
		pthread_cond_broadcast(&p->idle);
	pthread_mutex_unlock(&p->lock);
}

static void *relay_thread(void *arg)
{
	struct relay r = *(struct relay *)arg;
	int up;

	free(arg);
	up = upstream_connect(r.p);
	if (up < 0) {
		/* The program sees its proxy connection closed: a proxy error, not a hang. */
		pthread_mutex_lock(&r.p->lock);
		r.p->upstream_failed++;
		pthread_mutex_unlock(&r.p->lock);
		log_debug(r.p->log, "egress proxy: host port %d: %s", EGRESS_HOST_PORT,
			  strerror(-up));
	} else {
		fd_splice(r.fd, up);
		close(up);
	}
	close(r.fd);
	relay_end(r.p);
	return NULL;
}

/* Takes a slot and starts a relay thread for fd, or closes fd (over the cap, no memory). */
static void relay_spawn(struct egress_proxy *p, const pthread_attr_t *attr, int fd)
{
	struct relay *r;
	pthread_t th;
	bool full;

	pthread_mutex_lock(&p->lock);
	p->accepted++;
	full = p->active >= p->max_relays;
	if (full)
		p->refused++;
	else
		p->active++;
	pthread_mutex_unlock(&p->lock);
	if (full) {
		close(fd);
		return;
	}
	r = malloc(sizeof(*r));
	if (r) {
		*r = (struct relay){.p = p, .fd = fd};
		if (pthread_create(&th, attr, relay_thread, r) == 0)
			return;
		free(r);
	}
	close(fd);
	relay_end(p);
}

static void *accept_thread(void *arg)
{
	struct egress_proxy *p = arg;
	pthread_attr_t attr;

	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, RELAY_STACK);
	for (;;) {
		int fd = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC);
		bool stopping;

		if (fd >= 0) {
			relay_spawn(p, &attr, fd);
			continue;
		}
		pthread_mutex_lock(&p->lock);
		stopping = p->stopping;
		pthread_mutex_unlock(&p->lock);
		if (stopping)
			break;
		/* Out of fds or memory: wait rather than spin; a signal or an aborted connection
		 * is retried at once. */
		if (errno != EINTR && errno != ECONNABORTED)
			usleep(10000);
	}
	pthread_attr_destroy(&attr);
	return NULL;
}

static int listen_loopback(uint16_t *port)
{
	struct sockaddr_in sin = {.sin_family = AF_INET,
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				  .sin_port = htons(*port)};
	socklen_t len = sizeof(sin);
	int one = 1, fd, e;

	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	/* A restarted agent binds again while old connections sit in TIME_WAIT. */
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0 || listen(fd, 128) < 0 ||
	    getsockname(fd, (struct sockaddr *)&sin, &len) < 0)
		goto fail;
	*port = ntohs(sin.sin_port);
	return fd;
fail:
	e = errno;
	close(fd);
	return -e;
}

int egress_proxy_start(struct egress_proxy *p)
{
	int ret;

	if (!p->max_relays)
		p->max_relays = EGRESS_RELAYS_MAX;
	p->active = 0;
	p->accepted = p->refused = p->upstream_failed = 0;
	p->stopping = false;
	p->lfd = listen_loopback(&p->port);
	if (p->lfd < 0)
		return p->lfd;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->idle, NULL);
	ret = -pthread_create(&p->accept_th, NULL, accept_thread, p);
	if (ret < 0) {
		pthread_cond_destroy(&p->idle);
		pthread_mutex_destroy(&p->lock);
		close(p->lfd);
		p->lfd = -1;
		return ret;
	}
	return 0;
}

void egress_proxy_stop(struct egress_proxy *p)
{
	pthread_mutex_lock(&p->lock);
	p->stopping = true;
	pthread_mutex_unlock(&p->lock);
	/* Wakes the blocked accept4 (Linux: EINVAL on a listener shut down). */
	shutdown(p->lfd, SHUT_RDWR);
	pthread_join(p->accept_th, NULL);
	close(p->lfd);
	p->lfd = -1;
	pthread_mutex_lock(&p->lock);
	while (p->active > 0)
		pthread_cond_wait(&p->idle, &p->lock);
	pthread_mutex_unlock(&p->lock);
	pthread_cond_destroy(&p->idle);
	pthread_mutex_destroy(&p->lock);
}
