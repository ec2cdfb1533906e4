/* The host's side of a sandbox's chain: settled and its digests checked, outside the jail. */
#ifndef COVE_LIFECYCLE_CHAIN_CHECK_H
#define COVE_LIFECYCLE_CHAIN_CHECK_H

#include <stdbool.h>
#include <stddef.h>

#include "lifecycle/root.h"

/*
 * With no VMM on NAME's chain (the caller holds its start lock and the VMM has ended): the
 * chain's generations folded into chain.json and the leftovers of crashed commits removed
 * (chain_settle), then every digest the chain records checked against its file, reading only
 * the files changed since the last check (NAME/digest-stamps, which no VMM can reach). *checked:
 * every file was checked (so a restore need not read them again); false for a chain from
 * before digests. 0, or -errno with one line in err (a file that does not match its digest).
 */
int sbx_chain_check(const struct sbx_root *r, const char *name, bool *checked, char *err,
		    size_t errlen);
/*
 * Before packing an archive: the same, but only a file that does not match its digest stops it
 * (-EBADMSG); a chain that cannot be settled is packed as it is, as before generations.
 */
int sbx_chain_check_archive(const struct sbx_root *r, const char *name, char *err, size_t errlen);

/*
 * A saved template's chain checked once more (with no process left that could write its files:
 * its VMM and jail have exited) and its stamps frozen (chain_stamps_freeze): every file the
 * template's clones link then passes their first check unread. 0 or -errno with one line.
 */
int sbx_chain_stamps_freeze(const struct sbx_root *r, const char *name, char *err, size_t errlen);

#endif
