/* Where `cove create` finds the guest this project builds when the user names none. */
#ifndef COVE_LIFECYCLE_GUEST_FILES_H
#define COVE_LIFECYCLE_GUEST_FILES_H

#include <stddef.h>

/*
 * Fills kernel (a bzImage) and rootfs (the base ext4 image cove-init boots from) with the first
 * place that has both: $COVE_GUEST_DIR/{kernel/bzImage,rootfs/rootfs.ext4}; the build cache
 * ${COVE_CACHE:-$HOME/.cache/cove}/{kernel,rootfs}/KEY/ (the newest of each, as
 * guest/kernel/build and guest/rootfs/build leave them); /usr/share/cove/{kernel,rootfs}/.
 * A non-empty kernel or rootfs on entry is kept (the user named it). 0, or -ENOENT with one
 * line in err naming the places tried and how to build them.
 */
int sbx_guest_find(char *kernel, char *rootfs, size_t cap, char *err, size_t errlen);

#endif
