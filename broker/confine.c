/* cove-broker's jail profile: namespaces, the sandbox's directories hidden, no capability. */
#include "confine.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "common/caps.h"
#include "common/errmsg.h"
#include "common/file_io.h"
#include "common/userns.h"

int broker_confine(const char *const *dirs, int n, char *err, size_t errlen)
{
	int r;
	if (n <= 0)
		return 0;
	if (geteuid() != 0 && (r = userns_enter(geteuid(), getegid()))) {
		if (r == -EPERM || r == -EINVAL || r == -ENOSPC || r == -EACCES)
			return errmsg(err, errlen, 1,
				      "--confine: no user namespace here (%s): running unconfined",
				      strerror(-r));
		return errmsg(err, errlen, r, "--confine: user namespace: %s", strerror(-r));
	}
	/* Its own mounts, IPC and host name; the network namespace stays (it fetches). */
	if (unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS))
		return errmsg(err, errlen, -errno, "--confine: namespaces: %s", strerror(errno));
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL))
		return errmsg(err, errlen, -errno, "--confine: private mounts: %s",
			      strerror(errno));
	for (int i = 0; i < n; i++)
		if (mount("cove-confined", dirs[i], "tmpfs",
			  MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
			  "size=4k,nr_inodes=1,mode=0500"))
			return errmsg(err, errlen, -errno, "--confine: hide %s: %s", dirs[i],
				      strerror(errno));
	return 0;
}

int broker_drop_caps(char *err, size_t errlen)
{
	return caps_drop_bounding(err, errlen) ?: caps_drop_all(err, errlen);
}
