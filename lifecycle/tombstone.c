/* Writing and reading tombstones of deleted sandboxes. */
#include "lifecycle/tombstone.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/clock.h"
#include "common/dirfd_io.h"
#include "common/file_io.h"

#define TOMBSTONE_MAX 4096

static int stones_dir(const struct sbx_root *r, bool create)
{
	if (create && mkdirat(r->dfd, SBX_TOMBSTONES, 0700) < 0 && errno != EEXIST)
		return -errno;
	int fd = openat(r->dfd, SBX_TOMBSTONES, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

int sbx_tombstone_write(const struct sbx_root *r, const char *name, const char *why)
{
	char file[80], tmp[88];
	json_t *j = json_pack("{s:s,s:I,s:s}", "name", name, "deleted_ms",
			      (json_int_t)realtime_ms(), "why", why);
	char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
	int dfd, fd, ret;

	json_decref(j);
	if (!text)
		return -ENOMEM;
	snprintf(file, sizeof(file), "%s.json", name);
	snprintf(tmp, sizeof(tmp), ".%s.tmp", name);
	dfd = stones_dir(r, true);
	if (dfd < 0) {
		free(text);
		return dfd;
	}
	fd = dirfd_create(dfd, tmp, O_WRONLY | O_CLOEXEC, 0600);
	ret = fd < 0 ? fd : pwrite_full(fd, text, strlen(text), 0);
	if (fd >= 0) {
		if (!ret && fsync(fd) < 0)
			ret = -errno;
		close(fd);
	}
	if (!ret)
		ret = dirfd_rename(dfd, tmp, file) ?: dirfd_sync(dfd);
	close(dfd);
	free(text);
	return ret;
}

int sbx_tombstone_describe(const struct sbx_root *r, const char *name, char *msg, size_t cap)
{
	char file[80], buf[TOMBSTONE_MAX + 1], when[32];
	const char *why;
	int64_t ms;
	struct tm tm;
	time_t s;
	ssize_t n;
	json_t *j;
	int dfd, fd;

	snprintf(file, sizeof(file), "%s.json", name);
	dfd = stones_dir(r, false);
	if (dfd < 0)
		return -ENOENT;
	fd = dirfd_open(dfd, file, O_RDONLY | O_CLOEXEC);
	close(dfd);
	if (fd < 0)
		return -ENOENT;
	n = pread(fd, buf, TOMBSTONE_MAX, 0);
	close(fd);
	if (n <= 0)
		return -ENOENT;
	buf[n] = '\0';
	j = json_loads(buf, 0, NULL);
	ms = json_integer_value(json_object_get(j, "deleted_ms"));
	why = json_string_value(json_object_get(j, "why"));
	if (!j || ms <= 0 || !why || (uint64_t)(realtime_ms() - ms) > SBX_TOMBSTONE_KEEP_MS) {
		json_decref(j);
		return -ENOENT;
	}
	s = (time_t)(ms / 1000);
	gmtime_r(&s, &tm);
	strftime(when, sizeof(when), "%Y-%m-%d %H:%M UTC", &tm);
	if (msg && cap)
		snprintf(msg, cap, "sandbox %s was deleted on %s (%.80s)", name, when, why);
	json_decref(j);
	return 0;
}

void sbx_tombstone_clear(const struct sbx_root *r, const char *name)
{
	char file[80];
	int dfd = stones_dir(r, false);

	if (dfd < 0)
		return;
	snprintf(file, sizeof(file), "%s.json", name);
	(void)dirfd_unlink(dfd, file);
	close(dfd);
}
