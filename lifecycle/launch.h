/* Starting a sandbox's VMM process: detached, holding the sandbox's life lock, logging to a file.
 */
#ifndef COVE_LIFECYCLE_LAUNCH_H
#define COVE_LIFECYCLE_LAUNCH_H

#include <stddef.h>
#include <sys/types.h>

#define SBX_VMM_LOG  "vmm.log"
#define SBX_JAIL_DIR "jail" /* the jailed VMM's root is a tmpfs mounted here */
#define SBX_LOCK_FD  9	    /* the VMM's life lock, inherited at this fd (a jail keeps it) */
#define SBX_READY_FD 3	    /* a restoring VMM's --ready-fd: one line, "ok" once its vCPUs run */
#define SBX_LAZY_FD  4	    /* its --lazy-fd: the socket to the fetcher of layers still arriving */

/*
 * Forks; the child starts a session of its own, takes vmm.lock beneath dfd (the fd stays open
 * across exec, so the lock lives exactly as long as the VMM), writes its pid into it, points
 * stdin and stdout at /dev/null and stderr at vmm.log, and execs cove-vmm (sbx_vmm_exe) with
 * argv. ready_wr >= 0: the write end of a pipe, inherited at SBX_READY_FD (argv says
 * --ready-fd). Returns 0 once the exec happened (*pid set), -EWOULDBLOCK when another process
 * holds the lock, or -errno with one line in err.
 */
int sbx_launch(int dfd, char *const argv[], int ready_wr, pid_t *pid, char *err, size_t errlen);
/* The same with `lazy` >= 0 inherited at SBX_LAZY_FD (argv says --lazy-fd). */
int sbx_launch_lazy(int dfd, char *const argv[], int ready_wr, int lazy, pid_t *pid, char *err,
		    size_t errlen);

/*
 * Forks; the child runs fn(arg, report), which execs (the O_CLOEXEC pipe `report` then closes)
 * or writes an errno to `report` and exits. Returns 0 with *pid once the exec happened, the
 * child's -errno (also in *child_errno) when it reported one, or -errno with one line in err
 * when the fork itself failed (*child_errno 0).
 */
int sbx_spawn(void (*fn)(void *arg, int report), void *arg, pid_t *pid, int *child_errno, char *err,
	      size_t errlen);

/* The name of the VMM executable, installed beside cove (and built beside it in build/cli/). */
#define SBX_VMM_EXE "cove-vmm"

/*
 * The path of cove-vmm: the directory of /proc/self/exe (this cove binary) with SBX_VMM_EXE.
 * Returns 0, or -errno (-ENAMETOOLONG when it does not fit in cap).
 */
int sbx_vmm_exe(char *out, size_t cap);

/* The pid in vmm.lock while it is held; 0 when nobody holds it; -errno. */
pid_t sbx_vmm_pid(int dfd);

/* The last line of vmm.log (for an error message), "" when there is none. */
void sbx_vmm_log_tail(int dfd, char *out, size_t cap);
/* The same for any log file beneath dfd. */
void sbx_log_tail(int dfd, const char *file, char *out, size_t cap);

#endif
