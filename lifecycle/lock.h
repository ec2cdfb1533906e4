/* Lock files in a sandbox directory: the VMM's life lock and the lock that serializes starts. */
#ifndef COVE_LIFECYCLE_LOCK_H
#define COVE_LIFECYCLE_LOCK_H

#include <stdbool.h>
#include <sys/types.h>

/*
 * "vmm.lock" is held (flock, exclusive) by the process that runs the sandbox's VM for as long
 * as it lives: the launcher takes it and execs the VMM with the fd open, so the lock ends with
 * the process however it ends (kill -9 included). It is a file of its own: the chain directory
 * is flocked by the snapshot keys code, and a second flock of one file from one process blocks.
 * "start.lock" is held while a command brings the sandbox up, so that many clients reconnecting
 * at once start it once: the others wait, then find it running.
 */
#define SBX_LOCK_VMM   "vmm.lock"
#define SBX_LOCK_START "start.lock"

/*
 * Takes `file`'s exclusive lock beneath dfd (created 0600 when absent, never through a link).
 * wait: block until free; else -EWOULDBLOCK when held. keep_on_exec: the fd survives exec (for
 * the VMM's life lock); else it is O_CLOEXEC. The fd holding the lock, or -errno.
 */
int sbx_lock_take(int dfd, const char *file, bool wait, bool keep_on_exec);
/* The same, not waiting, O_CLOEXEC, through a read-write fd (a host process that writes its
 * pid into the file later, such as the broker's supervisor). */
int sbx_lock_take_rw(int dfd, const char *file);

/*
 * Writes pid into `file` (whose lock the caller holds) through a descriptor of its own, closed
 * at once: the lock's fd is read-only, so the VMM that inherits it cannot rewrite the pid the
 * host signals. 0 or -errno.
 */
int sbx_lock_write_pid(int dfd, const char *file, pid_t pid);

/* 1 when some process holds `file`'s lock, 0 when nobody does (or no such file), or -errno. */
int sbx_lock_held(int dfd, const char *file);

/* The pid written into `file` while its lock is held; 0 when nobody holds it; -errno. */
pid_t sbx_lock_pid(int dfd, const char *file);

#endif
