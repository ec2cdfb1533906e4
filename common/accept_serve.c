/* A listening socket served one detached thread per connection. */
#include "common/accept_serve.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

/* A connection's thread keeps its buffers on the heap; in a small guest (cove-init's agent and
 * broker proxy) a default 8 MiB stack per connection would be address space for nothing. */
#define ACCEPTED_STACK (256 * 1024)

struct accepted {
	accept_serve_fn serve;
	void *ctx;
	int fd;
};

static void *accepted_thread(void *arg)
{
	struct accepted a = *(struct accepted *)arg;

	free(arg);
	a.serve(a.ctx, a.fd);
	return NULL;
}

void accept_serve(int lfd, accept_serve_fn serve, void *ctx)
{
	pthread_attr_t attr;

	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, ACCEPTED_STACK);
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		struct accepted *a;
		pthread_t th;

		if (fd < 0) {
			/* Out of fds or memory: wait rather than spin; a signal or an aborted
			 * connection is retried at once. */
			if (errno != EINTR && errno != ECONNABORTED)
				usleep(10000);
			continue;
		}
		a = malloc(sizeof(*a));
		if (!a) {
			close(fd);
			continue;
		}
		*a = (struct accepted){.serve = serve, .ctx = ctx, .fd = fd};
		if (pthread_create(&th, &attr, accepted_thread, a) != 0) {
			close(fd);
			free(a);
		}
	}
}
