/* Entering a user namespace with a one-id map; see userns.h. */
#include "common/userns.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "common/file_io.h"

int userns_enter(uid_t in_uid, gid_t in_gid)
{
	unsigned uid = (unsigned)geteuid(), gid = (unsigned)getegid();
	char map[64];
	int r;

	if (unshare(CLONE_NEWUSER))
		return -errno;
	/* Not dumpable makes /proc/self root's: the maps need it back for a moment. */
	prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
	r = file_write_str("/proc/self/setgroups", "deny");
	snprintf(map, sizeof(map), "%u %u 1", (unsigned)in_uid, uid);
	if (!r)
		r = file_write_str("/proc/self/uid_map", map);
	snprintf(map, sizeof(map), "%u %u 1", (unsigned)in_gid, gid);
	if (!r)
		r = file_write_str("/proc/self/gid_map", map);
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	return r;
}
