/*
 * cove-oci: an OCI runtime (runc's command line) whose containers are cove microVMs. Each
 * container is a cove sandbox (oci- + 16 hex digits) booted from the bundle's root directory
 * as a disk kept by its digest (or from a cove image named by the cove.dev/image annotation), and
 * its process runs in the guest through a `cove exec` session held by the monitor: the process the
 * pid file names, whose exit status is the container's. README "Containers (cove-oci)".
 */
#ifndef COVE_CLI_OCI_H
#define COVE_CLI_OCI_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "common/log.h"
#include "oci/bundle.h"
#include "oci/checkpoint.h"
#include "oci/state.h"

struct oci_ctx {
	const char *root;	 /* --root */
	struct logger *log;	 /* --log (text or json); errors go to stderr too */
	unsigned max_root_disks; /* create: the host's oci.json (oci/host_conf.h) */
	char err[1024];
};

/* One error: to the log and, as a plain line, to stderr. Returns 1 (the exit status). */
int oci_fail(struct oci_ctx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * Runs `cove ARGV...` (the cove beside this executable, whatever argv[0] says) with stdin /dev/null
 * and its output captured (the container's stdio is never written): its exit status, or -errno. The
 * last line of its output goes into x->err when it fails.
 */
int oci_cove(struct oci_ctx *x, const char *const *argv);

/* `cove rm SANDBOX`: the VM ended, its files removed. Its status as oci_cove's. */
int oci_sandbox_rm(struct oci_ctx *x, const char *sandbox);

/* The pid file an engine asked for, written whole before it appears. 0 or -errno. */
int oci_pid_file(const char *path, pid_t pid);

/* The cove executable beside cove-oci into path. 0 or -errno. */
int oci_cove_path(char *path, size_t cap);

/*
 * The bundle's root as a cove image, named oci-root/<digest> in the image cache (oci/tree_digest.h:
 * the digest of everything the root holds). The first container of a root makes the ext4
 * (mkfs.ext4 -d) under that digest; a later one whose root has the same digest finds it and
 * makes none. Every sandbox boots it under a copy-on-write overlay; `cove image rm` removes it.
 * ref gets the name. 0 or -errno with x->err.
 */
int oci_disk_build(struct oci_ctx *x, const struct oci_bundle *b, const char *sandbox, char *ref,
		   size_t cap);

/* config.json's hostname (b->hostname; "" none) made the guest's, through cove-init's agent
 * (op hostname), after the sandbox starts: a restore's identity event names the sandbox. 0 or
 * -errno with x->err. */
int oci_hostname_apply(struct oci_ctx *x, const char *sandbox, const struct oci_bundle *b);

/* The bundle's tmpfs mounts and copied files (oci_bundle.mounts) made in the running sandbox's
 * guest, before its process starts. 0 or -errno with x->err. */
int oci_mounts_apply(struct oci_ctx *x, const char *sandbox, const struct oci_bundle *b);

/* The pty for a container on a terminal: its master sent over the engine's console socket
 * (SCM_RIGHTS), its slave returned (the process's stdio). -errno with x->err. */
int oci_console(struct oci_ctx *x, const char *socket_path);
/* In the forked monitor: the pty's slave (tty >= 0) becomes its controlling terminal and
 * stdio, in a session of its own; tty < 0: nothing. */
void oci_console_take(int tty);

/* argv for `cove exec SANDBOX [--session-file F] [-t] --env.. --cwd --user uid:gid --rlimit..
 * -- args` (one malloc'd block, NULL terminated, which also holds the --rlimit values; free with
 * free() after use: the other strings point into p, `user` and session_file). NULL when out of
 * memory. */
char **oci_exec_argv(const char *cove, const char *sandbox, const struct oci_process *p, char *user,
		     size_t usercap, const char *session_file);

/* How the monitor reaches the container's process (oci_monitor). */
struct oci_monitor_how {
	const char *sandbox;	  /* NULL: a holder (a pod's own container, no VM) */
	const char *session_file; /* cove exec --session-file: kept for a checkpoint; or NULL */
	const char *attach;	  /* a restore: `cove attach` this session instead of cove exec */
	bool end_vm;		  /* the sandbox is removed when the process ends */
};

/*
 * The monitor (the pid file's process): waits for `start` on the fifo (fifo_fd >= 0; -1 for an
 * exec or a restore, which go at once), runs the process through `cove exec` (or attaches the
 * restored one's session), passes INT, TERM, HUP, QUIT, USR1, USR2 and WINCH on to it, records
 * its status in ROOT/ID/exit (dfd; -1: no record, an exec's), and (end_vm) removes the sandbox.
 * A holder runs nothing and exits 0 on INT, TERM, HUP or QUIT. Never returns: exits with the
 * process's status (128 + N for signal N).
 */
void oci_monitor(struct oci_ctx *x, int dfd, int fifo_fd, const struct oci_monitor_how *how,
		 const struct oci_process *p) __attribute__((noreturn));

/* A restore's checkpoint: its record, checked, and its packed chain's directory. */
struct oci_restore {
	struct oci_ckpt rec;
	char archive[PATH_MAX + 64];
};

/*
 * create (rs NULL) and restore: the container ID from the bundle, its VM made (a restore's from
 * the checkpoint, on the same root), its monitor forked and named in pid_file. A created one
 * waits for start; a restored one runs, its monitor attached to the checkpointed process. The
 * exit status, after one line on error.
 */
int oci_container_make(struct oci_ctx *x, const char *id, const char *bundle, const char *pid_file,
		       const char *console, const struct oci_restore *rs);
/* ROOT/ID/root.json: the root disk's name, memory and vCPUs the VM got (a later checkpoint's
 * record). 0 or -errno with x->err... as used by oci_container_make. */
int oci_root_record(int dfd, const struct oci_ckpt *used);
/* The monitor and the `cove exec` it runs, killed; the sandbox removed (kill KILL). */
void oci_container_end(struct oci_ctx *x, int dfd, const struct oci_state *s);

/* The commands. argv[0] is the command name. */
int oci_cmd_create(struct oci_ctx *x, int argc, char **argv);
int oci_cmd_start(struct oci_ctx *x, int argc, char **argv);
int oci_cmd_state(struct oci_ctx *x, int argc, char **argv);
int oci_cmd_kill(struct oci_ctx *x, int argc, char **argv);
int oci_cmd_delete(struct oci_ctx *x, int argc, char **argv);
int oci_cmd_exec(struct oci_ctx *x, int argc, char **argv);
int oci_cmd_pause(struct oci_ctx *x, int argc, char **argv);
int oci_cmd_ps(struct oci_ctx *x, int argc, char **argv);
int oci_cmd_checkpoint(struct oci_ctx *x, int argc, char **argv);
int oci_cmd_restore(struct oci_ctx *x, int argc, char **argv);

#endif
