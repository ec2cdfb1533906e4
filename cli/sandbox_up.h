/* Bringing a named sandbox up: the reconnect every client command goes through. */
#ifndef COVE_CLI_SANDBOX_UP_H
#define COVE_CLI_SANDBOX_UP_H

#include <stdbool.h>
#include <stddef.h>

#include "lifecycle/root.h"

/* Exit statuses of a command that could not reach its sandbox (each one distinct). */
enum {
	SBX_EXIT_BAD_NAME = 64,
	SBX_EXIT_UNKNOWN = 65,
	SBX_EXIT_DELETED = 66,
	SBX_EXIT_START = 67,  /* it exists but could not be started (key refused, bad chain...) */
	SBX_EXIT_EXISTS = 68, /* a sandbox to be made (cove fork NAME NEW) exists already */
	/* another host holds its lease (cove-store printed one JSON line on stderr) */
	SBX_EXIT_HELD = 75,
	/* this host's CPU cannot take the sandbox's CPU state (one JSON line on stderr) */
	SBX_EXIT_CPU = 76,
};

/*
 * The JSON line a scheduler reads for SBX_EXIT_CPU, on stderr:
 * {"error":"cpu-incompatible","sandbox":NAME,"detail":LINE,"exit":76}.
 */
void sbx_cpu_refused(const char *name, const char *detail);

/*
 * With a store, before a command on NAME that does not pull by itself (cove start): when this
 * host has no directory and no tombstone for it, `cove-store pull NAME`. 0 pulled (*pulled);
 * SBX_EXIT_HELD (another host holds it: cove-store printed its JSON line) or SBX_EXIT_DELETED
 * (the store's tombstone); -1 otherwise (no store, here already, or not pulled: the command
 * then says what it says of an unknown name).
 */
int store_pull_absent(const char *name, bool *pulled);

/*
 * With a store: counts a reconnect or start of the sandbox at dfd in the host's cache counters
 * (lifecycle/cache_stats.h): a miss when it was just pulled from the store, a hit when its
 * local copy was here and not running. Nothing without a store.
 */
void sbx_cache_count(const struct sbx_root *r, int dfd, bool pulled);

/*
 * The vsock socket of SANDBOX for exec/attach/cp/forward: a path is itself; a name of a
 * sandbox `cove create` made is brought up first when it is not running (restored from its
 * newest committed layer; many callers at once start it once); any other name is a socket
 * registered in the runtime directory. 0, or a SBX_EXIT_* status with one line in err.
 * `why` names the command in the event log ("cove exec").
 */
int sbx_resolve(const char *sandbox, const char *why, char *uds, size_t len, char *err,
		size_t errlen);

/*
 * Starts a stopped, crashed or never-started sandbox (dfd: its directory) and waits until its
 * guest agent answers; a running one is left alone. With a policy in its spec, its cove-broker
 * is started first (or a live one reused), grants a new epoch, and the guest gets that epoch
 * and token in its identity event (once its agent answers after a boot; as the first message
 * after a restore). 0 or -errno with one line in err.
 */
int sbx_start(const struct sbx_root *r, const char *name, int dfd, const char *why, char *err,
	      size_t errlen);

/*
 * The exit status of a command (CMD, as "cove start") whose sbx_start of NAME returned RET with
 * ERR, after its one line on stderr: 0; 75 when another host holds the lease (cove-store printed
 * its JSON line); 76 with sbx_cpu_refused's line; else 67 with "CMD: NAME: ERR" (unless ERR is
 * empty because cove-store said why).
 */
int sbx_start_exit(const char *cmd, const char *name, int ret, const char *err);

/* PATCH /vm {"state": STATE} ("Paused" or "Resumed") on the API socket: 0 or -errno with err. */
int sbx_api_state(const char *api, const char *state, char *err, size_t errlen);

/* Asks the running sandbox's API for a snapshot into its chain (Diff, or Full for the first). */
int sbx_snapshot_now(const char *api_sock, char *err, size_t errlen);

#endif
