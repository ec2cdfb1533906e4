/* The image's root as a sparse ext4 file (mkfs.ext4 -d: owners, modes, xattrs, hard links and
 * symlinks as the directory holds them). */
#ifndef COVE_IMAGE_EXT4_H
#define COVE_IMAGE_EXT4_H
#include <stddef.h>
#include <stdint.h>

/* The file system's size for `bytes` of files in `entries` entries plus `free_bytes` left
 * for the sandbox: whole MiB, at least 64 MiB. Pure. */
uint64_t ext4_size_for(uint64_t bytes, uint64_t entries, uint64_t free_bytes);

/* mkfs.ext4 of `out` (created; sparse) from the directory `rootdir`: 0, or -errno with one
 * line in err (mkfs's own error goes to stderr). */
int ext4_build(const char *rootdir, const char *out, uint64_t size, uint64_t entries, char *err,
	       size_t errlen);
#endif
