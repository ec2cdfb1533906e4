/* Where sandboxes live: the persistent state root and the runtime directory for their sockets. */
#ifndef COVE_LIFECYCLE_ROOT_H
#define COVE_LIFECYCLE_ROOT_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

/*
 * state: ${COVE_STATE_DIR:-/var/lib/cove}, one directory per sandbox (spec, chain, disks, event
 * log, lock file), mode 0700 and owned by the user. run: ${COVE_RUN_DIR:-/run/cove} (or
 * $XDG_RUNTIME_DIR/cove for a user who cannot write /run), one directory per running sandbox
 * holding its sockets; short enough that run/NAME/vsock.sock_PORT fits a sun_path.
 */
struct sbx_root {
	int dfd; /* the state root, O_DIRECTORY */
	char state[PATH_MAX];
	char run[PATH_MAX];
	bool templates; /* the templates' root (lifecycle/template.h): never pushed to a store */
};

/* The longest run directory path: room for "/NAME/vsock.sock_4294967295" in 108 bytes. */
#define SBX_RUN_PATH_MAX 36

/* Opens (creating when `create`) the state root; 0 or -errno with one line in err. */
int sbx_root_open(struct sbx_root *r, bool create, char *err, size_t errlen);
void sbx_root_close(struct sbx_root *r);

/*
 * Opens the sandbox directory `name` beneath the root without following a link; with `create`
 * it must not exist yet (-EEXIST). The fd, or -errno with one line in err.
 */
int sbx_dir_open(const struct sbx_root *r, const char *name, bool create, char *err, size_t errlen);

/*
 * Calls fn(name, dfd, arg) for every sandbox directory beneath the root: a valid name, opened
 * as sbx_dir_open does (closed after fn). Stops at fn's first non-zero result and returns it.
 */
int sbx_root_each(const struct sbx_root *r, int (*fn)(const char *name, int dfd, void *arg),
		  void *arg);

/* run/NAME/FILE into buf; -ENAMETOOLONG when it does not fit. */
int sbx_run_path(const struct sbx_root *r, const char *name, const char *file, char *buf,
		 size_t cap);

/* Creates run/NAME (and run itself) mode 0700; 0 or -errno with one line in err. */
int sbx_run_dir_make(const struct sbx_root *r, const char *name, char *err, size_t errlen);

#endif
