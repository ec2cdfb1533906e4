/* Deadlines of sandboxes left alone: archive after so long stopped, delete after so long unused
 * (`cove gc`, also run in passing by `cove create` and `cove ls`). */
#ifndef COVE_LIFECYCLE_GC_H
#define COVE_LIFECYCLE_GC_H

#include <stdbool.h>
#include <stdint.h>

#include "lifecycle/root.h"
#include "lifecycle/spec.h"
#include "lifecycle/state.h"

enum sbx_gc_action { SBX_GC_NONE, SBX_GC_ARCHIVE, SBX_GC_DELETE };

/*
 * What a sandbox in `state` since `since_ms` is due for at `now_ms`: delete once it has not
 * run for delete_after, else archive once stopped (or crashed) for archive_after. A running or
 * paused one is never due; 0 means never.
 */
enum sbx_gc_action sbx_gc_due(enum sbx_state state, int64_t since_ms, int64_t now_ms,
			      const struct sbx_spec *s);

/*
 * Deletes NAME (dfd: its directory, closed here): the VMM's process if any is killed, then its
 * cove-broker if one runs, a tombstone saying `why` is left, the directory and its runtime
 * directory go. 0 or -errno.
 */
int sbx_remove(const struct sbx_root *r, const char *name, int dfd, const char *from,
	       const char *why);

/*
 * With a store, what the caller decides (the layers above own the store): may_collect answers
 * 0 when this host may archive or delete NAME (it holds its lease, or was its last owner),
 * else non-zero and NAME is left alone; deleted follows a delete (the store's tombstone).
 */
struct sbx_gc_hooks {
	int (*may_collect)(const char *name);
	void (*deleted)(const char *name);
};

/* Applies every due deadline under the root, and ends the cove-broker of every sandbox whose
 * VM does not run (stopped, crashed, archived); prints one line per action unless quiet.
 * hooks may be NULL (no store). Returns how many actions failed. */
int sbx_gc(const struct sbx_root *r, bool dry_run, bool quiet, const struct sbx_gc_hooks *hooks);

#endif
