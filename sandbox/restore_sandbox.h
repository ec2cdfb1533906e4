/* Restoring a sandbox: open, validate (before any VM exists), apply (build, restore, serve). */
#ifndef COVE_RESTORE_SANDBOX_H
#define COVE_RESTORE_SANDBOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/log.h"
#include "sandbox/machine_config.h"
#include "sandbox/options.h"
#include "snapshot/restore.h"

/* What a restore writes on its --ready-fd pipe, before the reason, when this host's CPU cannot
 * take the chain's CPU state (the host then exits 76). */
#define RESTORE_CPU_REFUSED "cpu-incompatible: "

/* `cove restore`'s options: everything the host says; the chain says only what the machine had. */
struct sandbox_restore_opts {
	const char *dir;
	uint64_t layer; /* 0: latest */
	const char *api_sock, *console, *vsock_uds, *snap_dir, *snap_root;
	uint64_t vsock_cid, interval_ms;
	uint64_t vsock_rate;   /* --vsock-rate, 0: none (never from the chain) */
	uint64_t idle_stop_ms; /* --idle-stop, 0: never */
	int keep;
	int ready_fd;
	enum log_level level;
	const char *key;
	bool verify;
	/* --digests-checked: the host (lifecycle) checked every digest just now
	 * (snapshot/DIGEST.md) */
	bool digests_checked;
	/* --lazy-fd N: the socket to the host's fetcher of layers still arriving from the store
	 * (snapshot/lazy_gate.h); -1 none */
	int lazy_fd;
	bool no_seccomp; /* --no-seccomp */
	int nr_disks;
	struct disk_opt disks[RUN_MAX_DISKS]; /* host paths: restore takes none from the chain */
	uint64_t console_max;
	struct jail_opts jail; /* --jail DIR --uid N --gid N ...; jail.dir NULL: none */
	/*
	 * Test hooks only (sandbox/phase_hook.h): a directory where restore marks each named
	 * phase reached and waits to be let go; cli/cmd_restore.c takes it from
	 * COVE_TEST_PHASE_DIR. NULL: no hooks.
	 */
	const char *phase_dir;
	uint64_t checked_us; /* how long open + validate took (set by the caller, for the log) */
};

/* Everything about the snapshot that can be checked without a VM, checked before one exists. */
struct sandbox_restore {
	struct snap_restore snap;
	struct machine_config mc;
};

/*
 * Open: the chain, its key, the layer's state file and machine description. 0 or -errno with
 * one line in `err`. `p` starts zeroed; sandbox_restore_close frees it whatever happened.
 */
int sandbox_restore_open(struct sandbox_restore *p, const struct sandbox_restore_opts *o, char *err,
			 size_t errlen);
/*
 * Validate: the host's disks and vsock socket against the machine description, then the
 * memory layers (and with --verify every encrypted page). 0 or -errno with one line in `err`.
 */
int sandbox_restore_validate(struct sandbox_restore *p, const struct sandbox_restore_opts *o,
			     char *err, size_t errlen);
/*
 * Apply: builds the sandbox (RAM mapped from the layers or filled lazily), restores vCPU and
 * device state and serves it until the guest stops. Returns the process's exit status.
 */
int sandbox_restore_run(struct sandbox_restore *p, const struct sandbox_restore_opts *o);
void sandbox_restore_close(struct sandbox_restore *p);

#endif
