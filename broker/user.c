/* Dropping the broker from root to its own user after it opened its files and sockets. */
#include "user.h"
#include "common/errmsg.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

int broker_user_lookup(const char *name, struct broker_user *u, char *err, size_t errlen)
{
	struct passwd pw, *res = NULL;
	char buf[4096], *end;
	unsigned long n;

	if (!name || !*name)
		return errmsg(err, errlen, -EINVAL, "empty user name");
	if (getpwnam_r(name, &pw, buf, sizeof(buf), &res) == 0 && res) {
		u->uid = res->pw_uid;
		u->gid = res->pw_gid;
		return 0;
	}
	errno = 0;
	n = strtoul(name, &end, 10);
	if (errno || *end || name[0] == '-' || n >= (unsigned long)(uid_t)-1)
		return errmsg(err, errlen, -ENOENT, "no user \"%.64s\"", name);
	/* A bare number: that uid, and its passwd group when it has an entry. */
	u->uid = (uid_t)n;
	u->gid =
	    getpwuid_r(u->uid, &pw, buf, sizeof(buf), &res) == 0 && res ? res->pw_gid : (gid_t)n;
	return 0;
}

int broker_user_drop(const struct broker_user *u, char *err, size_t errlen)
{
	if (u->uid == 0)
		return errmsg(err, errlen, -EINVAL, "--user must not be root");
	if (setgroups(0, NULL) || setgid(u->gid) || setuid(u->uid))
		return errmsg(err, errlen, -errno, "cannot become uid %u gid %u: %s",
			      (unsigned)u->uid, (unsigned)u->gid, strerror(errno));
	if (setuid(0) == 0 || getuid() != u->uid || geteuid() != u->uid)
		return errmsg(err, errlen, -EPERM, "root could be regained after dropping to %u",
			      (unsigned)u->uid);
	/* A uid change resets it to the sysctl's default: keep the VMM's uid out for sure. */
	if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0))
		return errmsg(err, errlen, -errno, "PR_SET_DUMPABLE: %s", strerror(errno));
	return 0;
}
