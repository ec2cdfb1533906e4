/* ext4 images through e2fsprogs' mkfs.ext4 -d (image/ext4.h). */
#include "image/ext4.h"

#include "common/errmsg.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

uint64_t ext4_size_for(uint64_t bytes, uint64_t entries, uint64_t free_bytes)
{
	/* Each file rounds up to a 4 KiB block; directories, inodes, the journal and ext4's
	 * reserve take about a fifth more. */
	uint64_t need = bytes + entries * 4096;
	need += need / 5 + (64ULL << 20) + free_bytes;
	need = (need + (1ULL << 20) - 1) & ~((1ULL << 20) - 1);
	return need < (64ULL << 20) ? (64ULL << 20) : need;
}

int ext4_build(const char *rootdir, const char *out, uint64_t size, uint64_t entries, char *err,
	       size_t errlen)
{
	char inodes[32], kib[32], dir[4200];
	snprintf(inodes, sizeof(inodes), "%llu", (unsigned long long)(entries + 16384));
	snprintf(kib, sizeof(kib), "%lluk", (unsigned long long)(size >> 10));
	snprintf(dir, sizeof(dir), "%s", rootdir);
	char *argv[] = {"mkfs.ext4",
			"-q",
			"-F",
			"-b",
			"4096",
			"-N",
			inodes,
			"-L",
			"cove-image",
			"-E",
			"root_owner=0:0,nodiscard,lazy_itable_init=1,lazy_journal_init=1",
			"-d",
			dir,
			(char *)out,
			kib,
			NULL};
	/* Made here, empty: mkfs.ext4 then formats it without saying it created a file. */
	int fd = open(out, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return errmsg(err, errlen, -errno, "%s: %s", out, strerror(errno));
	close(fd);
	char *envp[] = {"PATH=/usr/sbin:/sbin:/usr/bin:/bin", "LC_ALL=C", NULL};
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, 2, 1);
	pid_t pid;
	int r = posix_spawnp(&pid, "mkfs.ext4", &fa, NULL, argv, envp);
	posix_spawn_file_actions_destroy(&fa);
	if (r)
		return errmsg(err, errlen, -r, "cannot run mkfs.ext4 (e2fsprogs): %s", strerror(r));
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return errmsg(err, errlen, -errno, "mkfs.ext4: %s", strerror(errno));
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		return errmsg(err, errlen, -EIO, "mkfs.ext4 -d failed (its error is above)");
	return 0;
}
