/* Sandbox state from the lock file and the event log. */
#include "lifecycle/state.h"

#include <errno.h>
#include <string.h>

#include "lifecycle/lock.h"

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
	else if (*out == SBX_RUNNING || *out == SBX_PAUSED)
		*out = SBX_CRASHED;
	return 0;
}
