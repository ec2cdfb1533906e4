/* bench/io guest helper: random 4 KiB O_DIRECT reads and writes at queue depth 1.
 * usage: randio_guest DEV SIZE_MIB OPS SEED
 * Prints "RANDIO read OPS NS" and "RANDIO write OPS NS" (CLOCK_MONOTONIC nanoseconds). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t x;

static uint64_t rnd(void)
{
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return x;
}

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static int run(int fd, int write, unsigned long ops, uint64_t blocks, void *buf, uint64_t seed)
{
	x = seed * 0x9e3779b97f4a7c15ull + (write ? 17 : 1);
	uint64_t t0 = now_ns();
	for (unsigned long i = 0; i < ops; i++) {
		off_t off = (off_t)(rnd() % blocks) * 4096;
		ssize_t n = write ? pwrite(fd, buf, 4096, off) : pread(fd, buf, 4096, off);
		if (n != 4096) {
			printf("RANDIO_ERROR %s op %lu: %s\n", write ? "write" : "read", i,
			       n < 0 ? strerror(errno) : "short");
			return 1;
		}
	}
	if (write && fdatasync(fd)) {
		printf("RANDIO_ERROR fdatasync: %s\n", strerror(errno));
		return 1;
	}
	uint64_t t1 = now_ns();
	printf("RANDIO %s %lu %llu\n", write ? "write" : "read", ops, (unsigned long long)(t1 - t0));
	fflush(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: randio_guest DEV SIZE_MIB OPS SEED\n");
		return 1;
	}
	uint64_t blocks = strtoull(argv[2], NULL, 10) * 256;
	unsigned long ops = strtoul(argv[3], NULL, 10);
	uint64_t seed = strtoull(argv[4], NULL, 10);
	int fd = open(argv[1], O_RDWR | O_DIRECT);
	if (fd < 0) {
		printf("RANDIO_ERROR open %s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	void *buf;
	if (posix_memalign(&buf, 4096, 4096))
		return 1;
	memset(buf, 0xa5, 4096);
	if (run(fd, 0, ops, blocks, buf, seed) || run(fd, 1, ops, blocks, buf, seed))
		return 1;
	close(fd);
	return 0;
}
