/*
 * The container roots cove-oci keeps as disks in cove's image cache (oci-root/<digest>, made by
 * cli/oci_disk.c): each use marks its entry, and beyond the host's max_root_disks
 * (oci/host_conf.h) the least recently used are removed. A sandbox made from one keeps its own
 * hard link of the ext4, and so does a template, so removing an entry breaks neither.
 */
#ifndef COVE_OCI_ROOT_CACHE_H
#define COVE_OCI_ROOT_CACHE_H

#include <stddef.h>

#define OCI_ROOT_REF "oci-root/" /* + the tree digest's hex */

/* The entry `name` beneath the cache (its ext4 and record, then the directory), as far as it
 * exists. */
void oci_root_entry_remove(int cachefd, const char *name);

/* Marks the entry hex used now (its directory's mtime). */
void oci_root_touch(int cachefd, const char *hex);

/*
 * Removes the least recently used root disks (names and entries) until at most `keep` remain;
 * never the entry `spare` (the one in use now; NULL: none). The number removed, or -errno with
 * one line in err.
 */
int oci_root_trim(int cachefd, size_t keep, const char *spare, char *err, size_t errlen);

#endif
