/* A sandbox's state, read from what is on disk: its lock file and its event log. */
#ifndef COVE_LIFECYCLE_STATE_H
#define COVE_LIFECYCLE_STATE_H

#include <stddef.h>

#include "sandbox/event_log.h"

enum sbx_state {
	SBX_CREATING, /* the directory exists, no VM has run yet */
	SBX_RUNNING,  /* a process holds vmm.lock (paused is asked of its API) */
	SBX_PAUSED,
	SBX_STOPPED,  /* memory and disks in the chain, no process */
	SBX_CRASHED,  /* the log says running, nobody holds vmm.lock */
	SBX_ARCHIVED, /* the chain is packed into the archive file */
	SBX_DELETED,  /* only a tombstone remains */
};

const char *sbx_state_name(enum sbx_state s);
/* The state named s, or -EINVAL. */
int sbx_state_parse(const char *s, enum sbx_state *out);

/*
 * The state of the sandbox whose directory is dfd: running when vmm.lock is held (whatever the
 * log says: the log is written after the fact), else the last event's "to", where a running or
 * paused one without its process is crashed. `last` (may be NULL) gets the last event. 0 or
 * -errno (-EINVAL: the log's last line is not an event).
 */
int sbx_state_read(int dfd, enum sbx_state *out, struct sbx_event *last);

#endif
