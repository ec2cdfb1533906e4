/* This host's cache counters (cache_stats.h). */
#include "lifecycle/cache_stats.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include <jansson.h>

#define STATS_MAX  1024
#define STATS_LOCK ".cache-stats.lock"
#define STATS_TMP  ".cache-stats.tmp"

/* A field that is absent, negative or not an integer reads as 0. */
static uint64_t field(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);
	return json_is_integer(v) && json_integer_value(v) >= 0 ? (uint64_t)json_integer_value(v)
								: 0;
}

int cache_stats_load(int rootfd, struct cache_stats *s)
{
	char buf[STATS_MAX];
	int fd = openat(rootfd, CACHE_STATS_FILE, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	ssize_t n;

	memset(s, 0, sizeof(*s));
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	n = read(fd, buf, sizeof(buf));
	close(fd);
	if (n < 0)
		return -EIO;
	if (n >= (ssize_t)sizeof(buf))
		return 0; /* not ours: reads as zeros, and is rewritten */
	json_t *o = json_loadb(buf, (size_t)n, JSON_REJECT_DUPLICATES, NULL);
	if (json_is_object(o))
		*s = (struct cache_stats){field(o, "hits"), field(o, "misses"),
					  field(o, "evictions"), field(o, "evicted_bytes")};
	json_decref(o);
	return 0;
}

int cache_stats_add(int rootfd, const struct cache_stats *d)
{
	int lk = openat(rootfd, STATS_LOCK, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	struct cache_stats s;
	char text[256];
	int r, fd;

	if (lk < 0)
		return -errno;
	if (flock(lk, LOCK_EX) < 0) {
		r = -errno;
		close(lk);
		return r;
	}
	r = cache_stats_load(rootfd, &s);
	if (!r) {
		int len = snprintf(text, sizeof(text),
				   "{\"hits\":%llu,\"misses\":%llu,\"evictions\":%llu,"
				   "\"evicted_bytes\":%llu}\n",
				   (unsigned long long)(s.hits + d->hits),
				   (unsigned long long)(s.misses + d->misses),
				   (unsigned long long)(s.evictions + d->evictions),
				   (unsigned long long)(s.evicted_bytes + d->evicted_bytes));
		fd = openat(rootfd, STATS_TMP,
			    O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
		r = fd < 0 ? -errno : write(fd, text, (size_t)len) == len ? 0 : -EIO;
		if (fd >= 0)
			close(fd);
		if (!r && renameat(rootfd, STATS_TMP, rootfd, CACHE_STATS_FILE) < 0)
			r = -errno;
	}
	close(lk);
	return r;
}
