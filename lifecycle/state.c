/* Sandbox state from the lock file and the event log. */
#include "lifecycle/state.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lifecycle/lock.h"
#include "lifecycle/vmm_args.h"
#include "sandbox/event_log.h"
#include "sandbox/idle.h"

static const char *const names[] = {
    [SBX_CREATING] = "creating", [SBX_RUNNING] = "running", [SBX_PAUSED] = "paused",
    [SBX_STOPPED] = "stopped",	 [SBX_CRASHED] = "crashed", [SBX_ARCHIVED] = "archived",
    [SBX_DELETED] = "deleted",
};

const char *sbx_state_name(enum sbx_state s)
{
	return (unsigned)s < sizeof(names) / sizeof(names[0]) ? names[s] : "unknown";
}

int sbx_state_parse(const char *s, enum sbx_state *out)
{
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (!strcmp(s, names[i])) {
			*out = (enum sbx_state)i;
			return 0;
		}
	return -EINVAL;
}

/*
 * The note an idle stop leaves in the chain (sandbox/idle.h), taken by removing it: only the one
 * reader whose unlink succeeds records the stop. 0 when taken, else -errno (-ENOENT: none).
 * The note is a claim by the VMM, the one thing it can say here: it can only turn "crashed"
 * into "stopped"; the chain itself is checked like any other at the next restore.
 */
static int idle_note_take(int dfd)
{
	int cdfd = openat(dfd, SBX_CHAIN, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	struct stat st;
	int r = 0;

	if (cdfd < 0)
		return -errno;
	if (fstatat(cdfd, SBX_IDLE_NOTE, &st, AT_SYMLINK_NOFOLLOW) < 0)
		r = -errno;
	else if (!S_ISREG(st.st_mode))
		r = -EINVAL;
	else if (unlinkat(cdfd, SBX_IDLE_NOTE, 0) < 0)
		r = -errno;
	close(cdfd);
	return r;
}

/* The host's own record of the idle stop, written by the host: running -> stopped ("idle"). */
static enum sbx_state idle_stopped(int dfd, enum sbx_state from, struct sbx_event *last)
{
	if (sbx_event_append(dfd, sbx_state_name(from), "stopped", "idle") == 0 && last)
		sbx_event_last(dfd, last);
	return SBX_STOPPED;
}

int sbx_state_read(int dfd, enum sbx_state *out, struct sbx_event *last)
{
	struct sbx_event ev;
	int held = sbx_lock_held(dfd, SBX_LOCK_VMM);
	int ret;

	if (held < 0)
		return held;
	ret = sbx_event_last(dfd, &ev);
	if (ret == -ENOENT) {
		*out = held ? SBX_RUNNING : SBX_CREATING;
		if (last)
			memset(last, 0, sizeof(*last));
		return 0;
	}
	if (ret)
		return ret;
	if (last)
		*last = ev;
	if (sbx_state_parse(ev.to, out))
		return -EINVAL;
	if (held)
		*out = *out == SBX_PAUSED ? SBX_PAUSED : SBX_RUNNING;
	else if ((*out == SBX_RUNNING || *out == SBX_PAUSED) && idle_note_take(dfd) == 0)
		*out = idle_stopped(dfd, *out, last);
	else if (*out == SBX_RUNNING || *out == SBX_PAUSED)
		*out = SBX_CRASHED;
	return 0;
}
