/* Archiving a stopped sandbox: its chain and disk overlays packed into one compressed directory
 * (zstd per file, only its data runs: holes stay holes; a manifest of sizes, runs and SHA-256), and
 * unpacked again on reconnect. */
#ifndef COVE_LIFECYCLE_ARCHIVE_H
#define COVE_LIFECYCLE_ARCHIVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SBX_ARCHIVE	     "archive"
#define SBX_ARCHIVE_MANIFEST "manifest.json"
/* Caps on what an archive may claim (it is untrusted data on disk). */
#define SBX_ARCHIVE_MAX_FILES	4096
#define SBX_ARCHIVE_MAX_FILE	(1ULL << 40)
#define SBX_ARCHIVE_MAX_EXTENTS 65536 /* data runs of one file; more: packed whole */

/* A sandbox's top-level file that belongs in the archive: disk overlays and their maps. */
bool sbx_archive_top_file(const char *name);

struct sbx_archive_stats {
	uint64_t files, bytes_in, bytes_out; /* out: compressed (archive) or written (unarchive) */
};

/*
 * Packs NAME/chain/ and the sandbox's top-level disk overlays (disk*.ovl, disk*.ovl.map) into
 * NAME/archive/, synced, then removes the originals. The sandbox must not be running (the
 * caller holds its start lock). A crash before the rename leaves the chain as it was; after it,
 * the archive is complete. 0 or -errno with one line in err.
 */
int sbx_archive_pack(int dfd, struct sbx_archive_stats *st, char *err, size_t errlen);

/*
 * Unpacks NAME/archive/ back into NAME/chain/ and NAME/, checking every entry against the
 * manifest (plain names only, sizes capped, SHA-256 of what was written), then removes the
 * archive. 0 or -errno with one line in err; on failure nothing of the archive is removed.
 */
int sbx_archive_unpack(int dfd, struct sbx_archive_stats *st, char *err, size_t errlen);

#endif
