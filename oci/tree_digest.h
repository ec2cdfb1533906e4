/*
 * A container's root directory named by what it holds: SHA-256 over every entry (its path,
 * type, mode, owner, extended attributes, a link's target, a device's number, a hard link's
 * first name, a file's mtime, size and bytes), walked in name order without following links or
 * leaving the file system. Two roots with one digest make the same ext4 as far as a container
 * can tell, so cove-oci keeps the disk it made under this digest and a second container of the
 * same image builds none (README "Containers"). Two things are left out, because engines change
 * them in every container's root and the guest never sees them: the mtime of a directory and
 * of a symlink (engines make mount points, podman links /etc/mtab), and all but the type of an
 * entry a copied file replaces (podman writes an empty /etc/hosts, /run/.containerenv... where
 * its bind mounts go).
 */
#ifndef COVE_OCI_TREE_DIGEST_H
#define COVE_OCI_TREE_DIGEST_H

#include <stddef.h>
#include <stdint.h>

#include "image/digest.h"

#define OCI_TREE_ENTRIES_MAX (4u << 20) /* entries in one root */
#define OCI_XATTR_LIST_MAX   (64 << 10) /* an entry's attribute names */
#define OCI_XATTR_VALUE_MAX  (64 << 10) /* one attribute's value */

struct oci_tree_sum {
	char hex[DIGEST_HEX + 1];
	uint64_t entries;
	uint64_t file_bytes;  /* the regular files' sizes */
	uint64_t alloc_bytes; /* their allocated blocks */
};

/* The digest of the tree at root into *sum; replaced[n]: absolute paths inside the root that
 * copied files replace. 0, or -errno with one line in err (a file that changes size while it is
 * read is -EAGAIN). */
int oci_tree_digest(const char *root, const char *const *replaced, size_t n,
		    struct oci_tree_sum *sum, char *err, size_t errlen);

#endif
