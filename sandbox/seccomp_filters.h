/* Per-thread seccomp-BPF filters of the process that runs a guest, and its SIGSYS reporter. */
#ifndef COVE_SECCOMP_FILTERS_H
#define COVE_SECCOMP_FILTERS_H

#include <stdbool.h>
#include <stddef.h>

/*
 * The thread kinds (SECCOMP.md has the allowed calls of each and the order of installation).
 * Each thread installs its own kind's filter on itself; filters stack and threads created
 * later inherit their creator's, so the event loop's filter (installed last, on the main
 * thread) also covers the threads it starts afterwards (fork identity senders, idle asker).
 */
enum seccomp_kind {
	SECCOMP_VCPU,	/* KVM_RUN and the device exits it dispatches */
	SECCOMP_EVLOOP, /* main thread: event loop, API, vsock, blk completions, snapshots */
	SECCOMP_UFFD,	/* lazy restore: serves userfaultfd page faults */
	SECCOMP_KINDS,
};

/* The thread-name word of a kind ("vcpu", "evloop", "uffd"). NULL for an unknown kind. */
const char *seccomp_kind_name(enum seccomp_kind kind);
/* "vcpu" -> SECCOMP_VCPU...; -EINVAL for another word. */
int seccomp_kind_parse(const char *name, enum seccomp_kind *out);

/*
 * Installs the SIGSYS handler every filter's violations go to: it writes one line naming the
 * system call and the thread (its name, as pthread_setname_np set it) to fd 2, then restores
 * SIG_DFL and re-raises SIGSYS, so the process dies by SIGSYS. Call before the first filter.
 * 0 or -errno.
 */
int seccomp_trap_init(void);

/*
 * Loads kind's filter on the calling thread (no_new_privs first). A forbidden call traps into
 * the handler above. 0, or -errno with one line in err.
 */
int seccomp_install(enum seccomp_kind kind, char *err, size_t errlen);

/*
 * True when this build runs under AddressSanitizer/UBSan: LeakSanitizer needs ptrace and
 * clone at exit, so the sandbox runs without filters and says so once.
 */
bool seccomp_sanitized_build(void);

/*
 * Test-only (built with COVE_TEST_HOOKS): when $COVE_TEST_SECCOMP is "KIND:CALL" and KIND
 * names this kind, make the forbidden CALL now ("execve", "socket" = socket(AF_INET),
 * "open" = creating a new file by path, "mmap" = an executable mapping). Without the hooks,
 * or for another kind, nothing. Returns only if the call did not kill the process.
 */
void seccomp_test_trigger(enum seccomp_kind kind);

#endif
