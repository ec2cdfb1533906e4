/* One sandbox process: the VM, its board, console, signals, control API and snapshots, served from
 * one event loop. */
#ifndef COVE_SANDBOX_H
#define COVE_SANDBOX_H

#include <stdbool.h>
#include <stdint.h>

#include "sandbox/idle.h"
#include "sandbox/api.h"
#include "devices/board.h"
#include "devices/overlay_merge.h"
#include "sandbox/machine_config.h"
#include "sandbox/spawner.h"
#include "snapshot/snapshot.h"
#include "vmm/vm.h"

struct sandbox {
	struct vm vm;
	struct board board;
	struct logger log;
	struct api_backend be;
	struct api_server *api;
	int console_fd;
	int sig_fd;
	int timer_fd; /* periodic snapshots, -1 without */
	struct machine_config mc;
	char *config_json;
	/* Snapshots: set up when a directory is known (--snapshot-dir or the first request). */
	struct snap_ctx snap;
	bool snap_ready;
	int snap_keep;
	const char
	    *snap_root; /* --snapshot-root: the API may name ROOT/NAME; NULL: only snap.dir */
	/* Key provider spec for encrypted snapshots (from the command line), or NULL. */
	const char *snap_key;
	/*
	 * Sealers of disk overlay layers, one per encrypted chain this process froze or restored
	 * layers of (a clone reads its parent's chain and seals into its own); freed last.
	 */
#define SANDBOX_MAX_SEALERS 8
	struct snap_sealer *sealers[SANDBOX_MAX_SEALERS];
	int nr_sealers;
	/*
	 * The data key of the first encrypted chain this process restored or wrote (a locked
	 * copy): every chain it writes later keeps it, so the disk layers it shares with that
	 * chain stay readable from each of them.
	 */
	struct snap_key *data_key;
	/* Disks' frozen layers merged after a commit, put in place at the next snapshot's pause. */
	struct overlay_merged disk_merges[RUN_MAX_DISKS];
	uint64_t snap_interval_ms;
	uint64_t snaps_taken, snaps_failed;
	const char *api_sock;
	const char *console_path;
	uint64_t console_max;
	enum log_level log_level;
	int forks;		/* PUT /fork calls so far: names clones */
	int ready_fd;		/* restore --ready-fd: "ok\n" once running, -1 without */
	struct idle_watch idle; /* --idle-stop */
	const char *phase_dir;	/* restore's test phase hooks (sandbox/phase_hook.h), or NULL */
	bool vm_created, board_created;
#define SANDBOX_MAX_CLONES 256
	/* pidfds of clones started here that had not exited when last looked at */
	int clone_pidfds[SANDBOX_MAX_CLONES];
	int nr_clones;
	/* Starts clones (PUT /fork): forked in sandbox_build when there is an API socket. */
	struct spawner spawner;
	int exe_fd;	  /* jailed: the cove binary, kept by the jail for the spawner; else -1 */
	int key_relay_fd; /* jailed with a key provider: the key relay's socket; else -1 */
	/* The snapshot writer's io_uring, made before the filters (they forbid io_uring_setup). */
	struct layer_ring *wring;
	/* --no-seccomp (set before sandbox_build); seccomp_on: the threads install filters. */
	bool no_seccomp, seccomp_on;
};

/*
 * Opens the console (path: created 0600, never through a link; or stdout), capped at
 * console_max bytes (0: RUN_DEFAULT_CONSOLE_MAX), and the signalfd. 0 or -errno.
 */
int sandbox_init(struct sandbox *sb, const char *console_path, uint64_t console_max,
		 enum log_level level);
/* Creates the VM and its devices as `mc` describes (RAM from a layer file when mem_fd >= 0). */
int sandbox_build(struct sandbox *sb, const struct machine_config *mc, bool track_dirty, int mem_fd,
		  uint64_t mem_off);
/*
 * Sets the snapshot directory (and interval/keep); may be called before sandbox_serve.
 * Snapshots are encrypted when sb->snap_key (the host's provider spec) is set.
 */
/* One snapshot into the sandbox's chain now (full the first time): 0 or -errno with err. */
int sandbox_snapshot_now(struct sandbox *sb, char *err, size_t errlen);
int sandbox_snapshots(struct sandbox *sb, const char *dir, uint64_t interval_ms, int keep);
/*
 * The sealer for disk overlay layers of the chain `sc` has open (created on first use, kept
 * until sandbox_destroy). NULL when none can be made (too many chains, no memory).
 */
const struct overlay_sealer *sandbox_sealer(struct sandbox *sb, const struct snap_crypt *sc);
/* Keeps a copy of key as sb->data_key unless one is kept already. 0 or -errno. */
int sandbox_keep_data_key(struct sandbox *sb, const struct snap_key *key);
/* Serves until the VM stops; returns the process exit status. */
int sandbox_serve(struct sandbox *sb, const char *api_sock);
void sandbox_destroy(struct sandbox *sb);

#endif
