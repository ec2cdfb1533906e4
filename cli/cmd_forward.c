/* `cove forward SANDBOX HOSTPORT:GUESTPORT`: 127.0.0.1:HOSTPORT on the host to a guest TCP port. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli/sandbox_up.h"
#include "sandbox/agent_client.h"

#define FWD_CHUNK 65536

static const char forward_usage[] =
	"usage: cove forward SANDBOX HOSTPORT:GUESTPORT\n"
	"Listens on 127.0.0.1:HOSTPORT (0: any free port, printed) and carries each connection to\n"
	"127.0.0.1:GUESTPORT inside the sandbox over vsock. Runs until interrupted.\n";

struct fwd_conn {
	char uds[AGENT_PATH_MAX];
	int guest_port;
	int fd;
};

/* Copies both ways until both directions ended; a half-close is passed on. */
static void fwd_splice(int a, int b)
{
	char *buf = malloc(FWD_CHUNK);
	bool ab = true, ba = true;

	while (buf && (ab || ba)) {
		struct pollfd p[2] = {{.fd = ab ? a : -1, .events = POLLIN},
				      {.fd = ba ? b : -1, .events = POLLIN}};

		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		for (int i = 0; i < 2; i++) {
			int from = i ? b : a, to = i ? a : b;
			bool *open = i ? &ba : &ab;
			ssize_t n;

			if (!p[i].revents)
				continue;
			n = read(from, buf, FWD_CHUNK);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0 || wire_write_full(to, buf, (size_t)n) < 0) {
				*open = false;
				shutdown(to, SHUT_WR);
				if (n < 0)
					goto out;
			}
		}
	}
out:
	free(buf);
}

static void *fwd_thread(void *arg)
{
	struct fwd_conn *c = arg;
	json_t *req = json_pack("{s:s,s:i}", "op", "forward", "port", c->guest_port), *reply = NULL;
	char err[512];
	int gfd = req ? agent_call(c->uds, 0, req, &reply, err, sizeof(err)) : -ENOMEM;

	json_decref(req);
	if (gfd < 0) {
		fprintf(stderr, "cove forward: %s\n", gfd == -ENOMEM ? "out of memory" : err);
	} else {
		json_decref(reply);
		fwd_splice(c->fd, gfd);
		close(gfd);
	}
	close(c->fd);
	free(c);
	return NULL;
}

static int parse_port(const char *s, const char *end, int min)
{
	long v = 0;

	if (s == end || end - s > 5)
		return -1;
	for (; s < end; s++) {
		if (*s < '0' || *s > '9')
			return -1;
		v = v * 10 + (*s - '0');
	}
	return v >= min && v <= 65535 ? (int)v : -1;
}

int cmd_forward(int argc, char **argv)
{
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t slen = sizeof(sin);
	char uds[AGENT_PATH_MAX], err[512];
	const char *colon;
	int host_port, guest_port, lfd, one = 1;

	if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
		fputs(forward_usage, stdout);
		return 0;
	}
	if (argc != 3) {
		fprintf(stderr, "cove forward: want SANDBOX and HOSTPORT:GUESTPORT (try 'cove forward "
				"--help')\n");
		return 2;
	}
	colon = strchr(argv[2], ':');
	host_port = colon ? parse_port(argv[2], colon, 0) : -1;
	guest_port = colon ? parse_port(colon + 1, colon + strlen(colon), 1) : -1;
	if (host_port < 0 || guest_port < 0) {
		fprintf(stderr, "cove forward: '%s': want HOSTPORT:GUESTPORT (0..65535:1..65535)\n",
			argv[2]);
		return 2;
	}
	int st = sbx_resolve(argv[1], "cove forward", uds, sizeof(uds), err, sizeof(err));
	if (st) {
		fprintf(stderr, "cove forward: %s\n", err);
		return st;
	}
	signal(SIGPIPE, SIG_IGN);
	sin.sin_port = htons((uint16_t)host_port);
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(lfd, (struct sockaddr *)&sin, sizeof(sin)) < 0 || listen(lfd, 64) < 0 ||
	    getsockname(lfd, (struct sockaddr *)&sin, &slen) < 0) {
		fprintf(stderr, "cove forward: 127.0.0.1:%d: %s\n", host_port, strerror(errno));
		return 1;
	}
	fprintf(stderr, "cove forward: 127.0.0.1:%d -> guest port %d\n", ntohs(sin.sin_port),
		guest_port);
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		struct fwd_conn *c;
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
		snprintf(c->uds, sizeof(c->uds), "%s", uds);
		c->guest_port = guest_port;
		c->fd = fd;
		if (pthread_create(&th, NULL, fwd_thread, c) != 0) {
			close(fd);
			free(c);
			continue;
		}
		pthread_detach(th);
	}
}
