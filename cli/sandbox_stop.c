/* Stopping a named sandbox: pause, final snapshot, end of its VMM process. */
#include "cli/sandbox_stop.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/sandbox_up.h"
#include "common/errmsg.h"
#include "lifecycle/chain_check.h"
#include "lifecycle/launch.h"
#include "lifecycle/lock.h"
#include "sandbox/event_log.h"

int sbx_vmm_end(int dfd, int first_sig)
{
	pid_t pid = sbx_vmm_pid(dfd);
	int sig = first_sig;

	if (pid <= 0)
		return pid;
	for (int tick = 0;; tick++) {
		if (tick == 0 || (tick == SBX_STOP_WAIT_S * 10 && sig != SIGKILL)) {
			if (tick)
				sig = SIGKILL;
			if (kill(pid, sig) < 0 && errno != ESRCH)
				return -errno;
		}
		if (sbx_lock_held(dfd, SBX_LOCK_VMM) == 0)
			return 0;
		if (tick > SBX_STOP_WAIT_S * 20)
			return -ETIMEDOUT;
		usleep(100 * 1000);
	}
}

int sbx_stop_locked(const struct sbx_root *r, const char *name, int dfd, const char *api,
		    enum sbx_state *state, const char *cmd, const char *why, char *err,
		    size_t errlen)
{
	char why_not[512];
	bool checked;
	int ret =
	    (*state == SBX_PAUSED ? 0 : sbx_api_state(api, "Paused", why_not, sizeof(why_not)))
		?: sbx_snapshot_now(api, why_not, sizeof(why_not));

	if (ret) {
		if (*state != SBX_PAUSED)
			sbx_api_state(api, "Resumed", NULL, 0);
		return errmsg(err, errlen, ret,
			      "the final snapshot failed, so it keeps running: %s", why_not);
	}
	ret = sbx_vmm_end(dfd, SIGTERM);
	if (ret)
		return errmsg(err, errlen, ret, "its VMM did not exit: %s", strerror(-ret));
	sbx_event_append(dfd, sbx_state_name(*state), "stopped", why);
	*state = SBX_STOPPED;
	/* The final snapshot's new files are checked now, off the next reconnect's path. */
	if (sbx_chain_check(r, name, &checked, why_not, sizeof(why_not)))
		fprintf(stderr, "cove %s: %s: warning: %s\n", cmd, name, why_not);
	return 0;
}
