/* Cloning a sandbox's directory for `cove fork NAME NEW...`: its spec, and a chain of its own
 * built from the committed layers (immutable files: hard-linked, else copied). */
#ifndef COVE_LIFECYCLE_CLONE_H
#define COVE_LIFECYCLE_CLONE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lifecycle/root.h"

/* Flags of sbx_clone(). */
#define SBX_CLONE_COPY 1u /* copy every file instead of hard-linking it (tests, other mounts) */
/* `from` is a template (lifecycle/template.h), in a root of its own: `to` may have its name, and
 * the clone gets no copy of its egress CA (its broker makes one of its own). */
#define SBX_CLONE_TEMPLATE 2u

struct sbx_clone_stats {
	uint64_t linked, copied; /* files */
	uint64_t bytes_copied;
	bool archived; /* the clone is archived (its source was): starting it unpacks its copy */
};

/*
 * Checks the n names a fork of `from` would create, before anything is touched: each a valid
 * name, none given twice, none `from` (unless from is NULL), none an existing directory beneath
 * the root.
 * 0; -EINVAL (a bad name), -EALREADY (given twice) or -EEXIST, with one line in err.
 */
int sbx_clone_check(const struct sbx_root *r, const char *from, const char *const *names, int n,
		    char *err, size_t errlen);

/*
 * Makes sandbox `to` from `from` (sdfd: its directory; the caller holds its start lock, and a
 * running one has just been snapshotted): spec.json copied with the new name in its command
 * line, a new machine id and a new created time; chain/ holding hard links (or copies) of the files
 * of every committed layer (mem-N, state-N), of every frozen disk overlay layer (its .ovl and .map)
 * and copies of the keys file and layer-seq, then its own chain.json; a live overlay top is never
 * shared. An archived `from` gives an archived clone: its archive/ files linked. The event log
 * starts with creating -> stopped (or archived), `cause`. Everything is opened beneath
 * directory fds without following links, built in ROOT/.clone-TO-PID and renamed into place
 * (never over an existing name), so `to` appears whole or not at all.
 * 0; -EEXIST when `to` exists (nothing created); -ENOENT when `from` has no committed layer;
 * -errno; one line in err.
 */
int sbx_clone(const struct sbx_root *r, const char *from, int sdfd, const char *to, unsigned flags,
	      const char *cause, struct sbx_clone_stats *st, char *err, size_t errlen);

#endif
