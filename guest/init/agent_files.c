/* agent_files.c: put/get of one regular file: a JSON handshake, then exactly "size" raw bytes. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"
#include "common/fd_io.h"

static int path_arg(json_t *msg, const char **path)
{
	json_t *v = json_object_get(msg, "path");

	*path = json_string_value(v);
	if (!*path || (*path)[0] != '/' || json_string_length(v) != strlen(*path) ||
	    json_string_length(v) > EXEC_ARG_LEN_MAX)
		return -EINVAL;
	return 0;
}

/* {"op":"put","path":"/abs","mode":420,"size":N} -> {"ok":true} -> N bytes -> {"ok":true,...}.
 * The data goes to a temporary file beside the target, renamed over it once complete. */
int files_put(int fd, json_t *msg)
{
	json_t *jsize = json_object_get(msg, "size"), *jmode = json_object_get(msg, "mode");
	const char *path;
	char tmp[EXEC_ARG_LEN_MAX + 32], *dir_copy = NULL, *buf = NULL;
	unsigned long long size, done = 0;
	mode_t mode = 0644;
	int out = -1, ret;
	json_t *reply;

	if (path_arg(msg, &path) < 0)
		return wire_reply_error(fd, "put: \"path\" must be an absolute path");
	if (!json_is_integer(jsize) || json_integer_value(jsize) < 0 ||
	    (unsigned long long)json_integer_value(jsize) > AGENT_FILE_MAX)
		return wire_reply_error(fd, "put: \"size\" must be 0..%llu", AGENT_FILE_MAX);
	size = (unsigned long long)json_integer_value(jsize);
	if (jmode) {
		if (!json_is_integer(jmode) || json_integer_value(jmode) < 0 ||
		    json_integer_value(jmode) > 07777)
			return wire_reply_error(fd, "put: \"mode\" must be 0..07777");
		mode = (mode_t)json_integer_value(jmode);
	}
	dir_copy = strdup(path);
	buf = malloc(AGENT_CHUNK);
	if (!dir_copy || !buf) {
		ret = wire_reply_error(fd, "put: out of memory");
		goto out;
	}
	snprintf(tmp, sizeof(tmp), "%s/.cove-put.XXXXXX", dirname(dir_copy));
	out = mkostemp(tmp, O_CLOEXEC);
	if (out < 0) {
		ret = wire_reply_error(fd, "put %s: %s", path, strerror(errno));
		goto out;
	}
	ret = wire_reply_ok(fd);
	if (ret < 0)
		goto fail;
	while (done < size) {
		size_t want = size - done < AGENT_CHUNK ? (size_t)(size - done) : AGENT_CHUNK;

		ret = wire_read_full(fd, buf, want);
		if (ret < 0)
			goto fail; /* the host went away mid-file: nothing replaces the target */
		ret = wire_write_full(out, buf, want);
		if (ret < 0) {
			/* Keep reading so the host sees the error, not a broken pipe. */
			int e = ret;

			for (done += want; done < size; done += want) {
				want = size - done < AGENT_CHUNK ? (size_t)(size - done) : AGENT_CHUNK;
				if (wire_read_full(fd, buf, want) < 0)
					break;
			}
			wire_reply_error(fd, "put %s: write: %s", path, strerror(-e));
			goto fail;
		}
		done += want;
	}
	if (fchmod(out, mode) < 0 || fsync(out) < 0 || rename(tmp, path) < 0) {
		ret = wire_reply_error(fd, "put %s: %s", path, strerror(errno));
		goto fail;
	}
	close(out);
	out = -1;
	reply = json_pack("{s:b,s:I}", "ok", 1, "size", (json_int_t)size);
	ret = reply ? wire_msg_write(fd, reply) : -ENOMEM;
	json_decref(reply);
	goto out;
fail:
	close(out);
	out = -1;
	unlink(tmp);
out:
	if (out >= 0)
		close(out);
	free(buf);
	free(dir_copy);
	return ret;
}

/* {"op":"get","path":"/abs"} -> {"ok":true,"size":N,"mode":M} -> N raw bytes. */
int files_get(int fd, json_t *msg)
{
	const char *path;
	struct stat st;
	unsigned long long done = 0;
	char *buf;
	json_t *reply;
	int in, ret;

	if (path_arg(msg, &path) < 0)
		return wire_reply_error(fd, "get: \"path\" must be an absolute path");
	in = open(path, O_RDONLY | O_CLOEXEC);
	if (in < 0)
		return wire_reply_error(fd, "get %s: %s", path, strerror(errno));
	if (fstat(in, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(in);
		return wire_reply_error(fd, "get %s: not a regular file", path);
	}
	if ((unsigned long long)st.st_size > AGENT_FILE_MAX) {
		close(in);
		return wire_reply_error(fd, "get %s: larger than %llu bytes", path, AGENT_FILE_MAX);
	}
	buf = malloc(AGENT_CHUNK);
	reply = json_pack("{s:b,s:I,s:i}", "ok", 1, "size", (json_int_t)st.st_size, "mode",
			  (int)(st.st_mode & 07777));
	ret = buf && reply ? wire_msg_write(fd, reply) : -ENOMEM;
	json_decref(reply);
	/* The size is promised: a file that shrinks meanwhile is padded with zeros, one that grows
	 * is cut, so the stream stays in step. */
	while (ret == 0 && done < (unsigned long long)st.st_size) {
		size_t want = (unsigned long long)st.st_size - done < AGENT_CHUNK
				  ? (size_t)((unsigned long long)st.st_size - done)
				  : AGENT_CHUNK;
		ssize_t n = read_upto(in, buf, want);

		if (n < (ssize_t)want)
			memset(buf + (n > 0 ? n : 0), 0, want - (size_t)(n > 0 ? n : 0));
		ret = write_full(fd, buf, want);
		done += want;
	}
	free(buf);
	close(in);
	return ret;
}
