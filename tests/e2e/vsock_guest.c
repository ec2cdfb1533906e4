/* e2e guest helper: vsock stream listen/connect, data on stdout for sha256sum (busybox has no vsock
 * tools). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

static int write_all(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

static int do_listen(unsigned port)
{
	int s = socket(AF_VSOCK, SOCK_STREAM, 0);
	struct sockaddr_vm a = {
	    .svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_ANY, .svm_port = port};
	if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof(a)) || listen(s, 1)) {
		fprintf(stderr, "vsock_guest: listen: %s\n", strerror(errno));
		return 2;
	}
	fprintf(stderr, "vsock_guest: listening on %u\n", port);
	int c = accept(s, NULL, NULL);
	if (c < 0) {
		fprintf(stderr, "vsock_guest: accept: %s\n", strerror(errno));
		return 2;
	}
	static uint8_t buf[1 << 16];
	unsigned long long total = 0;
	for (;;) {
		ssize_t n = read(c, buf, sizeof(buf));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			fprintf(stderr, "vsock_guest: read: %s\n", strerror(errno));
			return 3;
		}
		if (n == 0)
			break;
		if (write_all(1, buf, (size_t)n))
			return 4;
		total += (unsigned long long)n;
	}
	close(c);
	fprintf(stderr, "vsock_guest: received %llu bytes\n", total);
	return 0;
}

static int do_connect(unsigned cid, unsigned port, unsigned long long n)
{
	int s = socket(AF_VSOCK, SOCK_STREAM, 0);
	struct sockaddr_vm a = {.svm_family = AF_VSOCK, .svm_cid = cid, .svm_port = port};
	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof(a))) {
		printf("vsock_guest: connect: %s\n", strerror(errno));
		fflush(stdout);
		return 5;
	}
	static uint8_t buf[1 << 16];
	uint64_t x = 0x9e3779b97f4a7c15ULL ^ n;
	unsigned long long sent = 0;
	while (sent < n) {
		size_t k = n - sent < sizeof(buf) ? (size_t)(n - sent) : sizeof(buf);
		for (size_t i = 0; i < k; i += 8) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			memcpy(buf + i, &x, 8); /* buf has room: its size is a multiple of 8 */
		}
		if (write_all(s, buf, k)) {
			fprintf(stderr, "vsock_guest: send: %s\n", strerror(errno));
			return 3;
		}
		if (write_all(1, buf, k))
			return 4;
		sent += k;
	}
	close(s);
	fprintf(stderr, "vsock_guest: sent %llu bytes\n", sent);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "listen"))
		return do_listen((unsigned)strtoul(argv[2], NULL, 10));
	if (argc == 5 && !strcmp(argv[1], "connect"))
		return do_connect((unsigned)strtoul(argv[2], NULL, 10),
				  (unsigned)strtoul(argv[3], NULL, 10),
				  strtoull(argv[4], NULL, 10));
	fprintf(stderr, "usage: vsock_guest listen PORT | connect CID PORT BYTES\n");
	return 1;
}
