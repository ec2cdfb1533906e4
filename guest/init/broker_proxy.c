/* broker_proxy.c: /run/cove/broker.sock in the guest: adds epoch/token to each request and relays
 * it to cove-broker over vsock (CID 2, port 1025), and the reply back unchanged. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

#include "agent.h"

struct proxy_conn {
	struct agent *ag;
	int fd;
};

static int broker_connect(struct agent *ag)
{
	struct sockaddr_vm addr = {
	    .svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_HOST, .svm_port = BROKER_PORT};
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	struct sockaddr *sa = (struct sockaddr *)&addr;
	socklen_t salen = sizeof(addr);
	int fd;

	if (ag->test_uds) {
		/* What cove does for a guest connection to CID 2 port P: the Unix socket PATH_P. */
		snprintf(sun.sun_path, sizeof(sun.sun_path), "%s_%d", ag->test_uds, BROKER_PORT);
		sa = (struct sockaddr *)&sun;
		salen = sizeof(sun);
	}
	fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, sa, salen) < 0) {
		int e = errno;

		close(fd);
		return -e;
	}
	return fd;
}

/* One program connection: any number of request/reply pairs, each over the same vsock stream. */
static void *proxy_thread(void *arg)
{
	struct proxy_conn *c = arg;
	int vfd = -1;

	for (;;) {
		char err[256];
		json_t *req = NULL, *reply = NULL;
		char token[TOKEN_HEX_MAX + 1];
		uint64_t epoch;
		int ret = wire_msg_read(c->fd, &req, err, sizeof(err));

		if (ret < 0) {
			if (ret == -EINVAL || ret == -EMSGSIZE)
				wire_reply_error(c->fd, "%s", err);
			break;
		}
		/* Whatever the program put there is replaced: only cove-init knows the identity. */
		pthread_mutex_lock(&c->ag->lock);
		epoch = c->ag->epoch;
		snprintf(token, sizeof(token), "%s", c->ag->token);
		pthread_mutex_unlock(&c->ag->lock);
		json_object_set_new(req, "epoch", json_integer((json_int_t)epoch));
		json_object_set_new(req, "token", json_string(token));
		explicit_bzero(token, sizeof(token));
		if (vfd < 0)
			vfd = broker_connect(c->ag);
		if (vfd < 0) {
			ret = wire_reply_error(c->fd, "broker unreachable: %s", strerror(-vfd));
			json_decref(req);
			if (ret < 0)
				break;
			continue;
		}
		ret = wire_msg_write(vfd, req);
		json_decref(req);
		if (ret == 0)
			ret = wire_msg_read(vfd, &reply, err, sizeof(err));
		if (ret < 0) {
			close(vfd);
			vfd = -1;
			if (wire_reply_error(c->fd, "broker: %s", ret == -EINVAL ? err : strerror(-ret)) < 0)
				break;
			continue;
		}
		ret = wire_msg_write(c->fd, reply);
		json_decref(reply);
		if (ret < 0)
			break;
	}
	if (vfd >= 0)
		close(vfd);
	close(c->fd);
	free(c);
	return NULL;
}

static void *accept_thread(void *arg)
{
	struct agent *ag = ((struct proxy_conn *)arg)->ag;
	int lfd = ((struct proxy_conn *)arg)->fd;

	free(arg);
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		struct proxy_conn *c;
		pthread_t th;

		if (fd < 0) {
			if (errno != EINTR && errno != ECONNABORTED)
				usleep(10000);
			continue;
		}
		c = malloc(sizeof(*c));
		if (!c) {
			close(fd);
			continue;
		}
		c->ag = ag;
		c->fd = fd;
		if (pthread_create(&th, NULL, proxy_thread, c) != 0) {
			close(fd);
			free(c);
			continue;
		}
		pthread_detach(th);
	}
	return NULL;
}

int broker_proxy_start(struct agent *ag)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	struct proxy_conn *a;
	pthread_t th;
	int fd, ret;

	if (ag->test_uds) {
		snprintf(sun.sun_path, sizeof(sun.sun_path), "%s.broker.sock", ag->test_uds);
	} else {
		if (mkdir("/run/cove", 0755) < 0 && errno != EEXIST)
			return -errno;
		snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", BROKER_SOCK);
	}
	unlink(sun.sun_path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0 || chmod(sun.sun_path, 0666) < 0 ||
	    listen(fd, 64) < 0) {
		ret = -errno;
		close(fd);
		return ret;
	}
	a = malloc(sizeof(*a));
	if (!a) {
		close(fd);
		return -ENOMEM;
	}
	a->ag = ag;
	a->fd = fd;
	ret = pthread_create(&th, NULL, accept_thread, a);
	if (ret != 0) {
		free(a);
		close(fd);
		return -ret;
	}
	pthread_detach(th);
	return 0;
}
