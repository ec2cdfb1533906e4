/* agent_forward.c: connects to 127.0.0.1:PORT in the guest and splices it with the host stream. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent.h"
#include "common/splice.h"

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
		fd_splice(fd, tcp);
	close(tcp);
	return ret;
}
