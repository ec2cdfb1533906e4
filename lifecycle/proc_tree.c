/* Signalling a process tree (lifecycle/proc_tree.h). */
#include "lifecycle/proc_tree.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>
#include <unistd.h>

/* Appends pid's children (every thread's) to list[*n..cap). */
static void children_of(pid_t pid, pid_t *list, size_t *n, size_t cap)
{
	char dir[64], path[128], buf[4096];
	snprintf(dir, sizeof(dir), "/proc/%d/task", (int)pid);
	DIR *d = opendir(dir);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%.20s/children", dir, e->d_name);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		ssize_t len = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
		if (fd >= 0)
			close(fd);
		if (len <= 0)
			continue;
		buf[len] = '\0';
		for (char *s = buf, *end; *s && *n < cap; s = end) {
			long c = strtol(s, &end, 10);
			if (end == s)
				break;
			bool seen = false;
			for (size_t i = 0; i < *n; i++)
				seen = seen || list[i] == (pid_t)c;
			if (c > 0 && !seen)
				list[(*n)++] = (pid_t)c;
		}
	}
	if (d)
		closedir(d);
}

/* pid and its descendants, breadth first, into list (at most PROC_TREE_MAX); their number. */
static size_t collect(pid_t pid, pid_t *list)
{
	size_t n = 1;
	list[0] = pid;
	for (size_t i = 0; i < n; i++)
		children_of(list[i], list, &n, PROC_TREE_MAX);
	return n;
}

int proc_tree_signal(pid_t pid, int sig)
{
	pid_t list[PROC_TREE_MAX], again[PROC_TREE_MAX];
	if (pid <= 0)
		return -EINVAL;
	/* The whole tree first: a process killed before its children were listed would leave
	 * them behind (reparented). */
	size_t n = collect(pid, list);
	if (kill(pid, sig) < 0)
		return -errno;
	for (size_t i = 1; i < n; i++)
		kill(list[i], sig);
	if (sig != SIGSTOP)
		return (int)n;
	/* A stopped process forks no more: one more walk finds a child forked meanwhile. */
	size_t m = collect(pid, again), added = 0;
	for (size_t i = 1; i < m; i++) {
		bool seen = false;
		for (size_t j = 0; j < n; j++)
			seen = seen || again[i] == list[j];
		if (!seen && kill(again[i], sig) == 0)
			added++;
	}
	return (int)(n + added);
}
