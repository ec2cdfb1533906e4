/* The defaults a sandbox takes from its image's config (Env, Entrypoint, Cmd, WorkingDir,
 * User), checked and capped before cove keeps them. */
#ifndef COVE_IMAGE_CONFIG_H
#define COVE_IMAGE_CONFIG_H
#include <jansson.h>
#include <stddef.h>

#define IMAGE_CFG_MAX_ITEMS  256
#define IMAGE_CFG_MAX_STRING 4096

/*
 * Pure over the parsed config (untrusted): a new object {"Env": [...], "Entrypoint": [...],
 * "Cmd": [...], "WorkingDir": "...", "User": "..."} with only strings without NUL bytes,
 * at most IMAGE_CFG_MAX_ITEMS per list and IMAGE_CFG_MAX_STRING bytes each; Env entries are
 * NAME=VALUE; WorkingDir is absolute or ""; User is NAME, UID, NAME:GROUP or UID:GID. Absent
 * fields are empty. An image for another architecture or OS than linux/amd64 is refused.
 * 0 with *out set, or -EINVAL with one line in err.
 */
int image_config_take(json_t *config, json_t **out, char *err, size_t errlen);
#endif
