/*
 * libFuzzer target: an image layer (image/unpack.c), the bytes of a tar an image holds: its
 * whiteouts, opaque directories, links and paths. The input is applied twice to a fresh root
 * (the second time over what the first made, so whiteouts find something to hide). Whatever
 * happens, nothing may appear outside the root: the directory beside it stays empty.
 */
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fuzz.h"
#include "image/unpack.h"
#include "lifecycle/tree.h"

static int work_dir(void)
{
	static int dfd = -1;
	if (dfd < 0) {
		char tmpl[] = "/tmp/cove-fuzz-layer-XXXXXX";
		if (!mkdtemp(tmpl))
			abort();
		dfd = open(tmpl, O_RDONLY | O_DIRECTORY);
		if (dfd < 0 || mkdirat(dfd, "outside", 0755) < 0)
			abort();
	}
	return dfd;
}

static void outside_empty(int dfd)
{
	struct stat s;
	if (fstatat(dfd, "outside", &s, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(s.st_mode) ||
	    s.st_nlink != 2)
		abort();
	int fd = openat(dfd, "outside", O_RDONLY | O_DIRECTORY);
	char buf[4096];
	/* getdents: only "." and ".." */
	long n = syscall(SYS_getdents64, fd, buf, sizeof(buf));
	close(fd);
	if (n > 48)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int dfd = work_dir();
	sbx_tree_remove(dfd, "root");
	if (mkdirat(dfd, "root", 0755) < 0)
		abort();
	int rootfd = openat(dfd, "root", O_RDONLY | O_DIRECTORY);
	int mfd = memfd_create("layer", MFD_CLOEXEC);
	if (rootfd < 0 || mfd < 0 || write(mfd, data, size) != (ssize_t)size)
		abort();
	struct layer_src src = {.fd = mfd, .size = size, .index = 1};
	if (sha256_hex(data, size, src.hex))
		abort();
	struct unpack_budget b = {.bytes_left = 16 << 20, .entries_left = 4096};
	struct unpack_stats st = {0};
	char err[512];
	for (int i = 0; i < 2; i++) {
		err[0] = '\0';
		int r = unpack_layer(rootfd, &src, &b, &st, NULL, err, sizeof(err));
		if (r && (!err[0] || strchr(err, '\n')))
			abort(); /* a refusal says why, on one line */
	}
	outside_empty(dfd);
	close(mfd);
	close(rootfd);
	sbx_tree_remove(dfd, "root");
	return 0;
}
