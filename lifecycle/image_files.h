/* The files a sandbox made from an OCI image keeps in its directory (cove create --image). */
#ifndef COVE_LIFECYCLE_IMAGE_FILES_H
#define COVE_LIFECYCLE_IMAGE_FILES_H

#include <stdbool.h>
#include <stddef.h>

#include "lifecycle/spec.h"

/* A hard link of the image's ext4 (disk 0's read-only base, under the sandbox's overlay), so
 * that removing the image or a template never breaks the sandbox. */
#define SBX_IMAGE_EXT4 "image.ext4"
/* The image's record: digest, reference and config (exec's defaults come from it). */
#define SBX_IMAGE_JSON "image.json"

/* True when s boots an image: cove's init initramfs, one overlay disk, and cove-init told to
 * switch to it (cove.root= on the command line). */
bool sbx_spec_is_image(const struct sbx_spec *s);

/* Disk 0 of s pointed at STATE/NAME/image.ext4, the sandbox's own link. 0 or -ENAMETOOLONG. */
int sbx_image_disk_point(struct sbx_spec *s, const char *state, const char *name);

/*
 * A clone (fork, create --from) of a sandbox or template made from an image: its image.ext4 and
 * image.json hard-linked from sdfd into the clone's directory tdfd, and disk 0 of s (the clone's
 * spec) pointed at STATE/to/image.ext4, so the clone outlives its source. Nothing to do (0) when
 * disk 0 is not the source's own image.ext4. 0 or -errno with one line in err.
 */
int sbx_image_files_clone(const char *state, int sdfd, int tdfd, const char *to, struct sbx_spec *s,
			  char *err, size_t errlen);

#endif
