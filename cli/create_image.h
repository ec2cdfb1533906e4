/* cove create --image: a sandbox whose root is an imported OCI image (issue 32). */
#ifndef COVE_CLI_CREATE_IMAGE_H
#define COVE_CLI_CREATE_IMAGE_H
#include "lifecycle/image_files.h"
#include "lifecycle/spec.h"

#include <jansson.h>
#include <stddef.h>

/*
 * The guest part of NAME's spec for image REF (cove image ls): the kernel, cove's init
 * initramfs (init.cpio.gz beside the root image the guest build made), the image's ext4 as
 * disk 0 under an overlay, and a command line naming the image's main process (Entrypoint +
 * Cmd, Env, WorkingDir, User; on_exit "restart" or "stop"). *image gets the image's record
 * (image.json: digest, config) for the sandbox's directory. 0 or -errno with one line in err.
 */
int create_image_spec(struct sbx_spec *s, const char *name, const char *ref, const char *on_exit,
		      json_t **image, char *err, size_t errlen);

/*
 * In NAME's new directory dfd: a hard link of the image's ext4 (so that cove image rm never
 * breaks the sandbox; disk 0 then names it) and image.json. 0 or -errno with one line in err.
 */
int create_image_keep(int dfd, struct sbx_spec *s, const char *sandbox_dir, json_t *image,
		      char *err, size_t errlen);

/* NAME's image.json (NULL when it was not made from an image). */
json_t *sandbox_image_read(int dfd);

/*
 * cove exec's defaults in sandbox NAME made from an image: its Env goes before the caller's
 * --env entries (which win, coming later), its WorkingDir and User where the caller gave none.
 * Returns the record the strings point into (the caller decrefs it), or NULL: nothing to add.
 */
json_t *image_exec_defaults(const char *name, json_t *env, const char **cwd, const char **user);
#endif
