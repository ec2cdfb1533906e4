/* A sandbox's chain and disk overlays replaced by a packed archive from elsewhere (a container
 * checkpoint: cove create --checkpoint, cove-oci restore). */
#ifndef COVE_LIFECYCLE_IMPORT_H
#define COVE_LIFECYCLE_IMPORT_H

#include <stddef.h>

#include "lifecycle/archive.h"

/*
 * The sandbox in dfd (stopped, never started: a clone of its template) gets the chain and disk
 * overlays packed in directory `src` (an archive/ as sbx_archive_pack made it, untrusted): every
 * entry of src must be a regular file with a plain name, at most SBX_ARCHIVE_MAX_FILES of them,
 * each at most SBX_ARCHIVE_MAX_FILE bytes; they are copied into dfd's archive/, the sandbox's own
 * overlays are removed, and sbx_archive_unpack checks each against the manifest (plain names,
 * sizes, SHA-256) as it unpacks. 0 or -errno with one line in err; on failure the sandbox is
 * left for the caller to remove.
 */
int sbx_import_archive(int dfd, const char *src, struct sbx_archive_stats *st, char *err,
		       size_t errlen);

/*
 * The other way: the sandbox's packed archive (dfd's archive/, as sbx_archive_pack left it)
 * copied into directory dst, which must not exist yet (made 0700; its parent is the caller's).
 * 0 or -errno with one line in err.
 */
int sbx_archive_copy_out(int dfd, const char *dst, char *err, size_t errlen);

#endif
