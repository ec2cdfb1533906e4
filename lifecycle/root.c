/* The state root and runtime directory of the lifecycle commands. */
#include "lifecycle/root.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "lifecycle/name.h"
#include "lifecycle/name.h"
#include "sandbox/agent_client.h"

int sbx_root_open(struct sbx_root *r, bool create, char *err, size_t errlen)
{
	const char *env = getenv("COVE_STATE_DIR");
	int n;

	r->dfd = -1;
	r->templates = false;
	n = snprintf(r->state, sizeof(r->state), "%s", env && *env ? env : "/var/lib/cove");
	if (n < 0 || (size_t)n >= sizeof(r->state))
		return errmsg(err, errlen, -ENAMETOOLONG, "COVE_STATE_DIR is too long");
	if (agent_state_dir(r->run, sizeof(r->run)) || strlen(r->run) > SBX_RUN_PATH_MAX)
		return errmsg(
		    err, errlen, -ENAMETOOLONG,
		    "runtime directory %s is longer than %d bytes: socket paths would not "
		    "fit (set COVE_RUN_DIR to a shorter path)",
		    r->run, SBX_RUN_PATH_MAX);
	r->dfd = dirfd_open_dir(r->state, create, err, errlen);
	if (r->dfd == -ENOENT && !create)
		return errmsg(err, errlen, -ENOENT, "no sandboxes yet (%s does not exist)",
			      r->state);
	return r->dfd < 0 ? r->dfd : 0;
}

void sbx_root_close(struct sbx_root *r)
{
	if (r->dfd >= 0)
		close(r->dfd);
	r->dfd = -1;
}

int sbx_dir_open(const struct sbx_root *r, const char *name, bool create, char *err, size_t errlen)
{
	int ret = sbx_name_check(name, err, errlen);
	int fd;

	if (ret)
		return ret;
	if (create && mkdirat(r->dfd, name, 0700) < 0)
		return errmsg(err, errlen, -errno,
			      errno == EEXIST ? "sandbox %s already exists"
					      : "sandbox %s: mkdir: %s",
			      name, strerror(errno));
	fd = openat(r->dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errmsg(err, errlen, -errno,
			      errno == ENOENT ? "no sandbox named %s" : "sandbox %s: %s", name,
			      strerror(errno));
	return fd;
}

int sbx_run_path(const struct sbx_root *r, const char *name, const char *file, char *buf,
		 size_t cap)
{
	int n = file ? snprintf(buf, cap, "%s/%s/%s", r->run, name, file)
		     : snprintf(buf, cap, "%s/%s", r->run, name);

	return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

int sbx_run_dir_make(const struct sbx_root *r, const char *name, char *err, size_t errlen)
{
	char path[PATH_MAX];
	int fd;

	fd = dirfd_open_dir(r->run, true, err, errlen);
	if (fd < 0)
		return fd;
	close(fd);
	if (sbx_run_path(r, name, NULL, path, sizeof(path)))
		return errmsg(err, errlen, -ENAMETOOLONG, "runtime path too long");
	fd = dirfd_open_dir(path, true, err, errlen);
	if (fd < 0)
		return fd;
	close(fd);
	return 0;
}

int sbx_root_each(const struct sbx_root *r, int (*fn)(const char *name, int dfd, void *arg),
		  void *arg)
{
	int fd = dup(r->dfd), ret = 0;
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return -ENOMEM;
	}
	rewinddir(d); /* the dup shares its offset with r->dfd, which an earlier pass moved */
	struct dirent *e;
	while (!ret && (e = readdir(d))) {
		if (sbx_name_check(e->d_name, NULL, 0))
			continue;
		int sfd = sbx_dir_open(r, e->d_name, false, NULL, 0);
		if (sfd < 0)
			continue;
		ret = fn(e->d_name, sfd, arg);
		close(sfd);
	}
	closedir(d);
	return ret;
}
