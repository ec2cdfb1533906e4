/* Appending and reading the sandbox event log (events.jsonl). */
#include "sandbox/event_log.h"

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
#include "common/file_io.h"

#define EVENT_TAIL 4096

static void iso_time(int64_t ms, char *buf, size_t cap)
{
	time_t s = (time_t)(ms / 1000);
	struct tm tm;

	gmtime_r(&s, &tm);
	snprintf(buf, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
		 tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ms % 1000));
}

int sbx_event_append(int dfd, const char *from, const char *to, const char *cause)
{
	char when[80];
	json_t *j;
	char *line;
	int fd, ret = 0;
	size_t len;

	iso_time(realtime_ms(), when, sizeof(when));
	j = json_pack("{s:s,s:s,s:s,s:s,s:i}", "time", when, "from", from, "to", to, "cause", cause,
		      "pid", (int)getpid());
	if (!j)
		return -EINVAL;
	line = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	if (!line)
		return -ENOMEM;
	len = strlen(line);
	line[len++] = '\n'; /* json_dumps' NUL becomes the newline; the length is known */
	fd = openat(dfd, SBX_EVENTS, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		ret = -errno;
	else {
		/* One write with O_APPEND: lines from concurrent commands never interleave. */
		ssize_t w = write(fd, line, len);

		if (w != (ssize_t)len)
			ret = w < 0 ? -errno : -EIO;
		else if (fsync(fd) < 0)
			ret = -errno;
		close(fd);
	}
	free(line);
	return ret;
}

static int parse_time(const char *s, int64_t *ms)
{
	struct tm tm = {0};
	int msec = 0;

	if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
		   &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &msec) != 7)
		return -EINVAL;
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	*ms = (int64_t)timegm(&tm) * 1000 + msec;
	return 0;
}

static int copy_field(json_t *j, const char *key, char *out, size_t cap)
{
	const char *s = json_string_value(json_object_get(j, key));

	if (!s || strlen(s) >= cap)
		return -EINVAL;
	strcpy(out, s);
	return 0;
}

int sbx_event_last(int dfd, struct sbx_event *ev)
{
	char buf[EVENT_TAIL + 1];
	struct stat st;
	off_t off;
	size_t n;
	char *end, *start;
	json_t *j;
	int fd, ret;

	fd = openat(dfd, SBX_EVENTS, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0) {
		ret = -errno;
		close(fd);
		return ret;
	}
	n = st.st_size < EVENT_TAIL ? (size_t)st.st_size : EVENT_TAIL;
	off = st.st_size - (off_t)n;
	ret = pread_full(fd, buf, n, off);
	close(fd);
	if (ret)
		return ret;
	buf[n] = '\0';
	/* A crash can leave a partial last line: take the last line that ends in '\n'. */
	end = memrchr(buf, '\n', n);
	if (!end)
		return -ENOENT;
	*end = '\0';
	start = memrchr(buf, '\n', (size_t)(end - buf));
	start = start ? start + 1 : buf;
	if (start == buf && off > 0)
		return -EINVAL; /* a line longer than the tail: not ours */
	j = json_loads(start, 0, NULL);
	if (!j)
		return -EINVAL;
	ret = copy_field(j, "from", ev->from, sizeof(ev->from)) ?:
	      copy_field(j, "to", ev->to, sizeof(ev->to)) ?:
	      copy_field(j, "cause", ev->cause, sizeof(ev->cause)) ?:
	      parse_time(json_string_value(json_object_get(j, "time")) ?: "", &ev->time_ms);
	json_decref(j);
	return ret;
}
