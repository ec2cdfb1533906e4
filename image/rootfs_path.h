/* Paths named by an image layer (untrusted) and the directories they lead to inside the root
 * being built, never through a link: a symlink an image holds stays a link and is never
 * followed on the host. */
#ifndef COVE_IMAGE_ROOTFS_PATH_H
#define COVE_IMAGE_ROOTFS_PATH_H
#include <stdbool.h>
#include <stddef.h>

#define ROOTFS_PATH_MAX 4096

/*
 * Pure: a layer entry's name made relative and plain: leading "./" and repeated or trailing
 * '/' dropped, "." components dropped. "" is the root itself. -EINVAL with one line in err for
 * an absolute path, a ".." component, a component longer than 255 bytes or a path longer than
 * ROOTFS_PATH_MAX.
 */
int rootfs_path_clean(const char *in, char *out, size_t cap, char *err, size_t errlen);

/*
 * The directory that holds the cleaned path `rel` beneath rootfd, as an O_PATH fd, and the
 * last component in name[cap] ("" for the root itself, whose fd is then the root's). Each
 * component is opened with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS: a symlink on the way is
 * -ELOOP ("writes through a symlink"), a non-directory -ENOTDIR. Missing directories are
 * made (0755, root's) when `create`, else -ENOENT. One line in err.
 */
int rootfs_open_parent(int rootfd, const char *rel, bool create, char *name, size_t cap, char *err,
		       size_t errlen);
#endif
