/* A sandbox's store counters on this host (store_stats.h). */
#include "lifecycle/store_stats.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include <jansson.h>

#define STATS_MAX  4096
#define STATS_LOCK ".store-stats.lock"

struct field {
	const char *key;
	size_t off;
};

#define F(k)                                                                                       \
	{                                                                                          \
#k, offsetof(struct store_stats, k)                                                \
	}
static const struct field fields[] = {
    F(uploaded_bytes), F(uploaded_blobs), F(upload_errors),    F(commits),   F(fetched_bytes),
    F(fetch_errors),   F(renewals),	  F(renewal_failures), F(takeovers), F(leases_lost),
    F(generation),     F(cache_hits),	  F(cache_misses),
};
#undef F

static uint64_t *at(struct store_stats *s, size_t off)
{
	return (uint64_t *)((char *)s + off);
}

static uint64_t get(const struct store_stats *s, size_t off)
{
	return *(const uint64_t *)((const char *)s + off);
}

/* Parses the file's text; a field that is absent, negative or not an integer reads as 0. */
static void parse(const char *text, struct store_stats *s)
{
	json_t *o = json_loads(text, JSON_REJECT_DUPLICATES, NULL);
	memset(s, 0, sizeof(*s));
	if (!json_is_object(o)) {
		json_decref(o);
		return;
	}
	for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
		json_t *v = json_object_get(o, fields[i].key);
		if (json_is_integer(v) && json_integer_value(v) >= 0)
			*at(s, fields[i].off) = (uint64_t)json_integer_value(v);
	}
	json_t *t = json_object_get(o, "last_commit_ms");
	if (json_is_integer(t) && json_integer_value(t) >= 0)
		s->last_commit_ms = json_integer_value(t);
	json_decref(o);
}

static int read_at(int dfd, struct store_stats *s)
{
	memset(s, 0, sizeof(*s));
	int fd = openat(dfd, STORE_STATS_FILE, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	char *buf = malloc(STATS_MAX);
	ssize_t n = buf ? read(fd, buf, STATS_MAX) : -1;
	close(fd);
	if (n >= 0 && n < STATS_MAX) {
		buf[n] = '\0';
		parse(buf, s);
	}
	free(buf);
	return n < 0 ? -EIO : 0; /* an oversized file reads as zeros, and is rewritten */
}

int store_stats_load(int dfd, struct store_stats *s)
{
	return read_at(dfd, s);
}

int store_stats_add(int dfd, const struct store_stats *d)
{
	int lk = openat(dfd, STATS_LOCK, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (lk < 0)
		return -errno;
	if (flock(lk, LOCK_EX) < 0) {
		int e = -errno;
		close(lk);
		return e;
	}
	struct store_stats s;
	int r = read_at(dfd, &s);
	if (!r) {
		for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
			if (strcmp(fields[i].key, "generation"))
				*at(&s, fields[i].off) += get(d, fields[i].off);
		if (d->generation)
			s.generation = d->generation;
		if (d->last_commit_ms)
			s.last_commit_ms = d->last_commit_ms;
		json_t *o = json_object();
		for (size_t i = 0; o && i < sizeof(fields) / sizeof(fields[0]); i++)
			json_object_set_new(o, fields[i].key,
					    json_integer((json_int_t)get(&s, fields[i].off)));
		if (o)
			json_object_set_new(o, "last_commit_ms", json_integer(s.last_commit_ms));
		char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
		json_decref(o);
		if (!text) {
			r = -ENOMEM;
		} else {
			const char *tmp = ".store-stats.tmp";
			int fd = openat(
			    dfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
			size_t n = strlen(text);
			r = fd < 0 ? -errno : write(fd, text, n) == (ssize_t)n ? 0 : -EIO;
			if (fd >= 0)
				close(fd);
			if (!r && renameat(dfd, tmp, dfd, STORE_STATS_FILE) < 0)
				r = -errno;
			free(text);
		}
	}
	close(lk);
	return r;
}
