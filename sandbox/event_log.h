/* The sandbox's event log: one JSON line per state change, appended, never rewritten. */
#ifndef COVE_SANDBOX_EVENT_LOG_H
#define COVE_SANDBOX_EVENT_LOG_H

#include <stddef.h>
#include <stdint.h>

#define SBX_EVENTS "events.jsonl"

/* A state change as the log holds it: {"time": UTC ISO 8601, "from", "to", "cause", "pid"}. */
struct sbx_event {
	int64_t time_ms; /* since the epoch */
	char from[16];
	char to[16];
	char cause[128];
};

/*
 * Appends one line for a change from -> to (cause: a short reason, e.g. "cove stop",
 * "idle 15m", "restore after crash") beneath dfd, in one write and synced. 0 or -errno.
 */
int sbx_event_append(int dfd, const char *from, const char *to, const char *cause);

/*
 * The last complete line of the log (read from its last 4 KiB). 0, -ENOENT when there is none,
 * -EINVAL when that line is not an event this code wrote.
 */
int sbx_event_last(int dfd, struct sbx_event *ev);

#endif
