/* Idle stop: a sandbox nobody uses takes a snapshot and ends its process (`--idle-stop`). */
#ifndef COVE_SANDBOX_IDLE_H
#define COVE_SANDBOX_IDLE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

struct sandbox;
struct evloop;

/*
 * Activity is any of: an API request, vsock traffic or an open vsock connection (exec, attach,
 * forward, cp, the broker), guest CPU time above IDLE_CPU_PERMILLE of one CPU averaged over
 * the quiet window, or a command the guest agent says is still running (attached or detached;
 * asked only once everything else has been quiet). After limit_ms without any, the sandbox
 * snapshots into its chain, leaves the note SBX_IDLE_NOTE there and stops with status 0. The
 * VMM never writes the lifecycle's event log (nothing it writes is read back as the host's own
 * record): the host turns the note into running -> stopped ("idle") the next time it looks
 * (lifecycle/state.c). A failed snapshot keeps it running.
 */
#define SBX_IDLE_NOTE	  "idle-stop"
#define IDLE_CPU_PERMILLE 20

struct idle_watch {
	uint64_t limit_ms;
	int timer_fd;
	uint64_t quiet_since_ns, quiet_cpu_ns; /* the quiet window: its start, CPU time then */
	uint64_t last_vsock_bytes, last_api;
	uint64_t api_calls; /* bumped from the API server's thread (atomic) */
	/* The agent question runs on a thread of its own: the vsock device lives on the loop. */
	pthread_t asker;
	bool asking, asked_busy, answered, busy_while_asking;
};

/* Arms the watch on the sandbox's loop (limit_ms 0: nothing). 0 or -errno after a log line. */
int idle_start(struct sandbox *sb, struct evloop *loop);
/* Called for every API request. */
void idle_note_api(struct idle_watch *w);
void idle_stop_watch(struct sandbox *sb);

#endif
