/* bench/io guest helper: listens on a vsock port and echoes every byte back (for round-trip
 * latency), until the peer closes. usage: vsock_bench_guest PORT CONNS: serves CONNS connections
 * one after another, then exits. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

int main(int argc, char **argv)
{
	unsigned port = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 5000;
	int s = socket(AF_VSOCK, SOCK_STREAM, 0);
	struct sockaddr_vm a = {
	    .svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_ANY, .svm_port = port};
	if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof(a)) || listen(s, 4)) {
		fprintf(stderr, "vsock_bench_guest: listen: %s\n", strerror(errno));
		return 2;
	}
	printf("VSOCK_LISTENING %u\n", port);
	fflush(stdout);
	unsigned conns = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : 1;
	static char buf[1 << 16];
	for (unsigned k = 0; k < conns; k++) {
		int c = accept(s, NULL, NULL);
		if (c < 0) {
			if (errno == EINTR)
				continue;
			fprintf(stderr, "vsock_bench_guest: accept: %s\n", strerror(errno));
			return 2;
		}
		for (;;) {
			ssize_t n = read(c, buf, sizeof(buf));
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				break;
			char *p = buf;
			while (n > 0) {
				ssize_t w = write(c, p, (size_t)n);
				if (w < 0 && errno == EINTR)
					continue;
				if (w <= 0) {
					n = -1;
					break;
				}
				p += w;
				n -= w;
			}
			if (n < 0)
				break;
		}
		close(c);
	}
	return 0;
}
