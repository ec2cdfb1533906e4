/* `cove forward SANDBOX HOSTPORT:GUESTPORT`: 127.0.0.1:HOSTPORT on the host to a guest TCP port. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli/sandbox_up.h"
#include "common/accept_serve.h"
#include "common/splice.h"
#include "sandbox/agent_client.h"

static const char forward_usage[] =
    "usage: cove forward SANDBOX HOSTPORT:GUESTPORT\n"
    "Listens on 127.0.0.1:HOSTPORT (0: any free port, printed) and carries each connection to\n"
    "127.0.0.1:GUESTPORT inside the sandbox over vsock. Runs until interrupted.\n";

/* Where every connection goes; lives as long as the accept loop. */
struct fwd_target {
	char uds[AGENT_PATH_MAX];
	int guest_port;
};

/* One local connection: its own agent connection to the guest port, spliced with it. */
static void fwd_serve(void *ctx, int fd)
{
	const struct fwd_target *t = ctx;
	json_t *req = json_pack("{s:s,s:i}", "op", "forward", "port", t->guest_port), *reply = NULL;
	char err[512];
	int gfd = req ? agent_call(t->uds, 0, req, &reply, err, sizeof(err)) : -ENOMEM;

	json_decref(req);
	if (gfd < 0) {
		fprintf(stderr, "cove forward: %s\n", gfd == -ENOMEM ? "out of memory" : err);
	} else {
		json_decref(reply);
		fd_splice(fd, gfd);
		close(gfd);
	}
	close(fd);
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
	struct fwd_target target;
	char err[512];
	const char *colon;
	int host_port, guest_port, lfd, one = 1;

	if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
		fputs(forward_usage, stdout);
		return 0;
	}
	if (argc != 3) {
		fprintf(stderr,
			"cove forward: want SANDBOX and HOSTPORT:GUESTPORT (try 'cove forward "
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
	int st =
	    sbx_resolve(argv[1], "cove forward", target.uds, sizeof(target.uds), err, sizeof(err));
	if (st) {
		if (err[0]) /* empty: cove-store said it */
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
	target.guest_port = guest_port;
	accept_serve(lfd, fwd_serve, &target);
}
