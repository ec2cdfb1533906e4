/* Two connected streams spliced both ways, half-closes passed on. */
#include "common/splice.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/fd_io.h"

#define SPLICE_CHUNK 65536

void fd_splice(int a, int b)
{
	char *buf = malloc(SPLICE_CHUNK);
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
			n = read(from, buf, SPLICE_CHUNK);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0 || write_full(to, buf, (size_t)n) < 0) {
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
