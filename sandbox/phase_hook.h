/* Test-only pauses at named phases of `cove restore`: DIR/PHASE.reached, then wait for
 * DIR/PHASE.go. */
#ifndef COVE_PHASE_HOOK_H
#define COVE_PHASE_HOOK_H

#include <stddef.h>
#include <stdint.h>

#include "common/log.h"

/*
 * The phases, in order (tests/e2e/snapshot_tests.py connects a client at each):
 *   "opened"  chain opened and validated, console open; no VM, no socket yet
 *   "built"   VM and devices built: the vsock socket listens; no API socket, no guest state
 *   "state"   vCPU and device state applied, devices resumed (the guest was sent the vsock
 *             transport reset), API socket listening; vCPUs not started
 *   "started" vCPUs running (--ready-fd said ok); the event loop has not run: nothing the host
 *             sent since the restore began has been read
 * The directory comes from COVE_TEST_PHASE_DIR (read by cli/cmd_restore.c only); unset, no
 * phase costs more than a NULL test.
 */
#define PHASE_HOOK_TIMEOUT_MS 60000
#define PHASE_HOOK_POLL_MS    10

/*
 * Creates DIR/PHASE.reached (0600, beneath an fd of DIR, never through a link, truncated if
 * there) holding this process's pid, then polls every PHASE_HOOK_POLL_MS until DIR/PHASE.go
 * exists (any kind of entry). 0 once it does, -ETIMEDOUT after timeout_ms, or -errno with one
 * line in err (DIR not a directory of ours, PHASE.reached a link or not a regular file).
 */
int phase_hook_wait(const char *dir, const char *phase, uint64_t timeout_ms, char *err,
		    size_t errlen);
/*
 * The hook as restore calls it: nothing when dir is NULL; a timeout is a warning and restore
 * goes on; any other failure is logged and returned (-errno): a misconfigured test fails loudly.
 */
int phase_hook(const char *dir, const char *phase, struct logger *log);

#endif
