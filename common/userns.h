/* Entering a user namespace with a one-id map: the jailed VMM's and cove-broker's. */
#ifndef COVE_COMMON_USERNS_H
#define COVE_COMMON_USERNS_H

#include <sys/types.h>

/*
 * unshare(CLONE_NEWUSER), then maps in_uid/in_gid inside to the caller's euid/egid (setgroups
 * denied). The process is not dumpable afterwards (it is made dumpable only while it writes its
 * maps, which /proc requires). 0 or -errno (the unshare's, or the map write's).
 */
int userns_enter(uid_t in_uid, gid_t in_gid);

#endif
