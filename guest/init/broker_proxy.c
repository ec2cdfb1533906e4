/* broker_proxy.c: /run/cove/broker.sock in the guest: adds epoch/token to each request and relays
 * it to cove-broker over vsock (CID 2, port 1025), and the reply back unchanged. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

#include "agent.h"
#include "common/accept_serve.h"

/* What the accept thread needs. */
struct proxy_listen {
	struct agent *ag;
	int lfd;
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
	/* Linux gives up on a vsock connect after 2 s; a host busy with many streams may answer
	 * later than that (50 downloads at once lost some), so wait as long as a TCP connect. */
	if (!ag->test_uds) {
		struct timeval tv = {.tv_sec = VSOCK_CONNECT_TIMEOUT_S};

		(void)setsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_CONNECT_TIMEOUT, &tv, sizeof(tv));
	}
	if (connect(fd, sa, salen) < 0) {
		int e = errno;

		close(fd);
		return -e;
	}
	return fd;
}

/* One program connection: any number of request/reply pairs, each over the same vsock stream. */
static void proxy_serve(void *ctx, int fd)
{
	struct agent *ag = ctx;
	int vfd = -1;

	for (;;) {
		char err[256];
		json_t *req = NULL, *reply = NULL;
		char token[TOKEN_HEX_MAX + 1];
		uint64_t epoch;
		int ret = wire_msg_read(fd, &req, err, sizeof(err));

		if (ret < 0) {
			if (ret == -EINVAL || ret == -EMSGSIZE)
				wire_reply_error(fd, "%s", err);
			break;
		}
		/* Whatever the program put there is replaced: only cove-init knows the identity. */
		pthread_mutex_lock(&ag->lock);
		epoch = ag->epoch;
		snprintf(token, sizeof(token), "%s", ag->token);
		pthread_mutex_unlock(&ag->lock);
		json_object_set_new(req, "epoch", json_integer((json_int_t)epoch));
		json_object_set_new(req, "token", json_string(token));
		explicit_bzero(token, sizeof(token));
		if (vfd < 0)
			vfd = broker_connect(ag);
		if (vfd < 0) {
			ret = wire_reply_error(fd, "broker unreachable: %s", strerror(-vfd));
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
			if (wire_reply_error(fd, "broker: %s",
					     ret == -EINVAL ? err : strerror(-ret)) < 0)
				break;
			continue;
		}
		ret = wire_msg_write(fd, reply);
		json_decref(reply);
		if (ret < 0)
			break;
	}
	if (vfd >= 0)
		close(vfd);
	close(fd);
}

static void *accept_thread(void *arg)
{
	struct proxy_listen l = *(struct proxy_listen *)arg;

	free(arg);
	accept_serve(l.lfd, proxy_serve, l.ag);
}

int broker_proxy_start(struct agent *ag)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	struct proxy_listen *a;
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
	a->lfd = fd;
	ret = pthread_create(&th, NULL, accept_thread, a);
	if (ret != 0) {
		free(a);
		close(fd);
		return -ret;
	}
	pthread_detach(th);
	return 0;
}
