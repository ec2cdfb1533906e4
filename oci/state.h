/*
 * cove-oci's record of each container: ROOT/ID/ (ROOT is --root, one per engine namespace)
 * holds state.json, the start fifo, and the monitor's exit file. Everything here is written by
 * cove-oci itself; state.json is still size-capped and checked when read back.
 */
#ifndef COVE_OCI_STATE_H
#define COVE_OCI_STATE_H

#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define OCI_ID_MAX	   128
#define OCI_STATE_JSON	   "state.json"
#define OCI_START_FIFO	   "start.fifo"
#define OCI_STARTED	   "started"   /* made by `start`: the container process was let go */
#define OCI_EXIT	   "exit"      /* the container process's exit status, from the monitor */
#define OCI_PAUSED	   "paused"    /* made by `pause`, removed by `resume` */
#define OCI_EXEC_PID	   "exec.pid"  /* the monitor's cove exec: "PID START" */
#define OCI_SESSION	   "session"   /* the container process's exec session id (cove exec) */
#define OCI_ROOT_RECORD	   "root.json" /* its root disk, memory and vCPUs (a checkpoint's) */
#define OCI_DEFAULT_ROOT   "/run/cove-oci"
#define OCI_SANDBOX_PREFIX "oci-"

struct oci_state {
	char id[OCI_ID_MAX + 1];
	char sandbox[32];      /* the cove sandbox: oci- + 16 hex digits */
	char bundle[PATH_MAX]; /* absolute */
	char rootfs[PATH_MAX]; /* absolute */
	pid_t pid;	       /* the monitor (the pid file's process), 0 before it runs */
	uint64_t pid_start;    /* its start time (/proc/PID/stat field 22): pid reuse guard */
	char created[40];      /* RFC 3339 */
	json_t *annotations;   /* owned, may be NULL */
	/* cove's settings at create (COVE_STATE_DIR, COVE_RUN_DIR, COVE_GUEST_DIR; "" unset):
	 * engines call later commands with environments of their own, and the sandbox stays
	 * where it was made. */
	char cove_env[3][PATH_MAX];
	/* A pod's sandbox container (CRI's "pause": annotation io.kubernetes.cri.container-type
	 * sandbox): no VM and no process in one; its monitor only holds until a signal. */
	bool holder;
};

/* The variables of oci_state.cove_env, in order. */
extern const char *const oci_cove_vars[3];

/* cove_env from this process's environment (create). */
void oci_state_env_take(struct oci_state *s);
/* This process's environment from cove_env (every later command, before it runs cove). */
void oci_state_env_apply(const struct oci_state *s);

/* Pure: a container id an engine gives: 1..128 of [A-Za-z0-9_.-], not starting with '.'. */
bool oci_id_ok(const char *id);

/* Pure: the sandbox name for (root, id): "oci-" + 16 hex digits of SHA-256(root "\0" id). */
int oci_sandbox_name(const char *root, const char *id, char *out, size_t cap);

/* ROOT/ID opened (created with `create`, mode 0700, failing with -EEXIST when it exists):
 * its fd, or -errno with one line in err. ROOT is made when missing. */
int oci_state_dir(const char *root, const char *id, bool create, char *err, size_t errlen);

/* state.json (atomically: a temporary file renamed). 0 or -errno. */
int oci_state_write(int dfd, const struct oci_state *s);
/* state.json read back and checked. 0 or -errno with one line in err. */
int oci_state_read(int dfd, struct oci_state *s, char *err, size_t errlen);
void oci_state_free(struct oci_state *s);

/* A process's start time (clock ticks since boot), 0 when it is gone. */
uint64_t oci_proc_start(pid_t pid);
/* The monitor still runs: same pid and start time, not a zombie. */
bool oci_monitor_alive(const struct oci_state *s);

/* The monitor's cove exec process, when it still runs (OCI_EXEC_PID, its start time checked):
 * its pid, else 0. */
pid_t oci_exec_child(int dfd);

/* "created", "running", "paused" or "stopped", from the monitor and the marker files. */
const char *oci_status(int dfd, const struct oci_state *s);

/* The runtime spec's state object: ociVersion, id, status, pid (0 when stopped), bundle,
 * rootfs, created, owner, annotations. */
json_t *oci_state_json(int dfd, const struct oci_state *s);

#endif
