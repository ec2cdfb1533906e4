/*
 * Imported images on this host: STATE/.images/<manifest digest hex>/ holds rootfs.ext4 (the
 * image's root, sparse) and image.json (what cove took from the image: its config defaults,
 * digest, source, sizes); refs.json maps names to digests. All of it is written by cove.
 */
#ifndef COVE_IMAGE_CACHE_H
#define COVE_IMAGE_CACHE_H
#include "image/digest.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#define IMAGES_DIR     ".images"
#define IMAGE_EXT4     "rootfs.ext4"
#define IMAGE_JSON     "image.json"
#define IMAGE_REFS     "refs.json"
#define IMAGE_NAME_MAX 200

/* Pure: an image name a user gives: 1..200 of [A-Za-z0-9._/:@-], starting with a letter or
 * digit, without "..". */
bool image_name_ok(const char *name);

/* The images' directory beneath the state root's fd (created 0700 when `create`): its fd, or
 * -errno (-ENOENT: nothing imported yet) with one line in err. */
int image_cache_open(int statefd, bool create, char *err, size_t errlen);

/* The refs (a JSON object name -> hex), read under the cache's lock: 0 and *out, or -errno. */
int image_refs_read(int cachefd, json_t **out, char *err, size_t errlen);
/* Sets (hex != NULL) or removes (hex == NULL) one name, under the cache's lock. */
int image_ref_set(int cachefd, const char *name, const char *hex, char *err, size_t errlen);

/*
 * A name, "sha256:HEX", or at least 12 leading hex digits of one imported image, to its
 * digest's hex. 0, -ENOENT (no such image) or -EINVAL (ambiguous), with one line in err.
 */
int image_resolve(int cachefd, const char *ref, char hex[DIGEST_HEX + 1], char *err, size_t errlen);

/* image.json of an imported image (parsed; the caller owns it), or -errno. */
int image_meta_read(int cachefd, const char *hex, json_t **out, char *err, size_t errlen);
#endif
