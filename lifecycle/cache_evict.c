/* Evicting one sandbox's local copy (cache_evict.h). */
#include "lifecycle/cache_evict.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/errmsg.h"
#include "lifecycle/broker.h"
#include "lifecycle/cache_scan.h"
#include "lifecycle/lazy_files.h"
#include "lifecycle/lock.h"
#include "lifecycle/state.h"
#include "lifecycle/tree.h"

int cache_evict(const struct sbx_root *r, const char *name, cache_committed_fn committed, void *arg,
		char *err, size_t errlen)
{
	int dfd = sbx_dir_open(r, name, false, err, errlen), lk = -1, fl = -1, ret = 0;
	enum sbx_state st;
	char why[256] = "", aside[SBX_NAME_MAX + 32];
	uint32_t tag = 0;
	struct stat was, now;

	if (dfd < 0)
		return dfd;
	lk = sbx_lock_take(dfd, SBX_LOCK_START, false, false);
	fl = lk < 0 ? -1 : sbx_lock_take(dfd, CACHE_FOLLOW_LOCK, false, false);
	if (lk < 0 || fl < 0)
		ret = errmsg(err, errlen, -EBUSY,
			     "%s is being started, stopped, forked or uploaded", name);
	if (!ret &&
	    (sbx_state_read(dfd, &st, NULL) || (st != SBX_STOPPED && st != SBX_CRASHED) ||
	     sbx_lock_held(dfd, SBX_LOCK_VMM) != 0 || sbx_lock_held(dfd, SBX_LAZY_LOCK) != 0))
		ret = errmsg(err, errlen, -EBUSY, "%s is not stopped any more", name);
	if (!ret && faccessat(dfd, SBX_BROKER_AUDIT, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
		ret =
		    errmsg(err, errlen, -EBUSY, "%s: its broker audit log is kept only here", name);
	if (!ret && committed(arg, name, dfd, why, sizeof(why)))
		ret = errmsg(err, errlen, -ESTALE, "%s: %s", name, why);
	/*
	 * Its broker and runtime directory are found by the sandbox's name: ended while nothing
	 * can start it (its start lock), before the name can belong to a pulled copy.
	 */
	if (!ret) {
		int rfd = open(r->run, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

		sbx_broker_end(r, name);
		if (rfd >= 0) {
			sbx_tree_remove(rfd, name);
			close(rfd);
		}
	}
	if (!ret && getrandom(&tag, sizeof(tag), 0) != (ssize_t)sizeof(tag))
		ret = errmsg(err, errlen, -EIO, "no random bytes");
	snprintf(aside, sizeof(aside), ".evict-%s-%08x", name, tag);
	/* Gone from its name at once, whole: a command from now on pulls it from the store. */
	if (!ret &&
	    (fstat(dfd, &was) < 0 || renameat2(r->dfd, name, r->dfd, aside, RENAME_NOREPLACE) < 0))
		ret = errmsg(err, errlen, -errno, "%s: %s", name, strerror(errno));
	/* The name still led to the directory checked (nothing replaced it meanwhile). */
	if (!ret && (fstatat(r->dfd, aside, &now, AT_SYMLINK_NOFOLLOW) < 0 ||
		     now.st_dev != was.st_dev || now.st_ino != was.st_ino)) {
		renameat2(r->dfd, aside, r->dfd, name, RENAME_NOREPLACE);
		ret = errmsg(err, errlen, -EBUSY, "%s was replaced while it was checked", name);
	}
	if (!ret) {
		ret = sbx_tree_remove(r->dfd, aside);
		if (ret)
			errmsg(err, errlen, ret, "%s: removing %s: %s", name, aside,
			       strerror(-ret));
	}
	if (fl >= 0)
		close(fl);
	if (lk >= 0)
		close(lk);
	close(dfd);
	return ret;
}
