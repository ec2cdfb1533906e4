/* Stopping a named sandbox's VMM: the final snapshot, then the process ended. */
#ifndef COVE_CLI_SANDBOX_STOP_H
#define COVE_CLI_SANDBOX_STOP_H

#include <stddef.h>

#include "lifecycle/root.h"
#include "lifecycle/state.h"

/* How long a VMM gets to exit after SIGTERM before SIGKILL. */
#define SBX_STOP_WAIT_S 30

/* Ends the VMM holding vmm.lock beneath dfd: first_sig, then SIGKILL after SBX_STOP_WAIT_S.
 * 0 once it is gone (or none ran), or -errno. */
int sbx_vmm_end(int dfd, int first_sig);

/*
 * A running or paused sandbox to stopped: paused (so the guest cannot change what the final
 * snapshot holds), snapshotted, its process ended, `running -> stopped` (why) in its event log,
 * *state set. The caller holds its start lock. If the snapshot fails it keeps running. api: its
 * API socket. 0 or -errno with one line in err; a failed check of the new files afterwards is
 * one warning line on stderr, prefixed "cove CMD: NAME:".
 */
int sbx_stop_locked(const struct sbx_root *r, const char *name, int dfd, const char *api,
		    enum sbx_state *state, const char *cmd, const char *why, char *err,
		    size_t errlen);

#endif
