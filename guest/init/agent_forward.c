/* agent_forward.c: connects to 127.0.0.1:PORT in the guest and splices it with the host stream. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent.h"

/* Copies both ways until both directions have ended; a half-close is passed on as one. */
static void splice_loop(int a, int b)
{
	char *buf = malloc(AGENT_CHUNK);
	bool open_ab = true, open_ba = true; /* a->b and b->a still flowing */

	while (buf && (open_ab || open_ba)) {
		struct pollfd p[2] = {{.fd = open_ab ? a : -1, .events = POLLIN},
				      {.fd = open_ba ? b : -1, .events = POLLIN}};

		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		for (int i = 0; i < 2; i++) {
			int from = i ? b : a, to = i ? a : b;
			bool *open = i ? &open_ba : &open_ab;
			ssize_t n;

			if (!p[i].revents)
				continue;
			n = read(from, buf, AGENT_CHUNK);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0 || wire_write_full(to, buf, (size_t)n) < 0) {
				*open = false;
				shutdown(to, SHUT_WR);
				if (n < 0)
					goto out; /* reset: nothing more will come either way */
			}
		}
	}
out:
	free(buf);
}

/* {"op":"forward","port":P} -> {"ok":true} -> raw bytes both ways. */
int forward_handle(int fd, json_t *msg)
{
	json_t *jport = json_object_get(msg, "port");
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	int tcp, ret;

	if (!json_is_integer(jport) || json_integer_value(jport) < 1 ||
	    json_integer_value(jport) > 65535)
		return wire_reply_error(fd, "forward: \"port\" must be 1..65535");
	sin.sin_port = htons((uint16_t)json_integer_value(jport));
	tcp = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (tcp < 0)
		return wire_reply_error(fd, "forward: socket: %s", strerror(errno));
	if (connect(tcp, (struct sockaddr *)&sin, sizeof(sin)) < 0) {
		ret = wire_reply_error(fd, "forward: connect 127.0.0.1:%d: %s",
				       (int)json_integer_value(jport), strerror(errno));
		close(tcp);
		return ret;
	}
	ret = wire_reply_ok(fd);
	if (ret == 0)
		splice_loop(fd, tcp);
	close(tcp);
	return ret;
}
