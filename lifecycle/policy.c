/* The broker policy a sandbox keeps: checked when read from the user, written beneath its dir. */
#include "lifecycle/policy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "common/file_io.h"

int sbx_policy_check(const char *buf, size_t len, char *err, size_t errlen)
{
	json_error_t je;
	json_t *j;
	int ret = 0;

	if (len == 0)
		return errmsg(err, errlen, -EINVAL, "empty");
	if (len > SBX_POLICY_MAX)
		return errmsg(err, errlen, -EFBIG, "larger than %d KiB", SBX_POLICY_MAX / 1024);
	if (memchr(buf, '\0', len))
		return errmsg(err, errlen, -EINVAL, "not JSON text (a NUL byte)");
	j = json_loadb(buf, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
	if (!j)
		return errmsg(err, errlen, -EINVAL, "not JSON: line %d: %.200s", je.line, je.text);
	if (!json_is_object(j))
		ret = errmsg(err, errlen, -EINVAL, "not a JSON object");
	json_decref(j);
	return ret;
}

/* Reads and checks an open policy file; closes fd. */
static int load_fd(int fd, char **buf, size_t *len, char *err, size_t errlen)
{
	struct stat st;
	char *b = NULL;
	int ret;

	if (fstat(fd, &st) < 0) {
		ret = errmsg(err, errlen, -errno, "%s", strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		ret = errmsg(err, errlen, -EINVAL, "not a regular file");
		goto out;
	}
	if (st.st_size > SBX_POLICY_MAX) {
		ret = errmsg(err, errlen, -EFBIG, "larger than %d KiB", SBX_POLICY_MAX / 1024);
		goto out;
	}
	b = malloc((size_t)st.st_size + 1);
	if (!b) {
		ret = errmsg(err, errlen, -ENOMEM, "out of memory");
		goto out;
	}
	ret = pread_full(fd, b, (size_t)st.st_size, 0);
	if (ret) {
		errmsg(err, errlen, ret, "%s", ret == -EIO ? "changed while read" : strerror(-ret));
		goto out;
	}
	b[st.st_size] = '\0';
	ret = sbx_policy_check(b, (size_t)st.st_size, err, errlen);
out:
	close(fd);
	if (ret) {
		free(b);
		return ret;
	}
	*buf = b;
	*len = (size_t)st.st_size;
	return 0;
}

int sbx_policy_load(const char *path, char **buf, size_t *len, char *err, size_t errlen)
{
	int fd;

	*buf = NULL;
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return errmsg(err, errlen, -errno, "%s", strerror(errno));
	return load_fd(fd, buf, len, err, errlen);
}

int sbx_policy_load_at(int dfd, char **buf, size_t *len, char *err, size_t errlen)
{
	int fd;

	*buf = NULL;
	fd = dirfd_open(dfd, SBX_POLICY, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return errmsg(err, errlen, fd, "%s", strerror(-fd));
	return load_fd(fd, buf, len, err, errlen);
}

int sbx_policy_write(int dfd, const char *buf, size_t len)
{
	int fd = dirfd_create(dfd, ".policy.json.tmp", O_WRONLY | O_CLOEXEC, 0600);
	int ret;

	if (fd < 0)
		return fd;
	ret = pwrite_full(fd, buf, len, 0);
	if (!ret && fsync(fd) < 0)
		ret = -errno;
	close(fd);
	if (!ret)
		ret = dirfd_rename(dfd, ".policy.json.tmp", SBX_POLICY);
	if (!ret)
		ret = dirfd_sync(dfd);
	if (ret)
		dirfd_unlink(dfd, ".policy.json.tmp");
	return ret;
}
