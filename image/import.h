/* `cove image import`: a source's image checked, its layers applied, its root made an ext4
 * file cached by the image's digest, and a name pointing at it. */
#ifndef COVE_IMAGE_IMPORT_H
#define COVE_IMAGE_IMPORT_H
#include "common/log.h"
#include "image/cache.h"

#include <stdbool.h>
#include <stdint.h>

struct import_opts {
	const char *source;
	const char *name;    /* NULL: the name the source gives, else the source's file name */
	uint64_t max_bytes;  /* cap on the unpacked image (and an archive source) */
	uint64_t free_bytes; /* room left in the ext4 for the sandbox's own files */
};

struct import_result {
	char hex[DIGEST_HEX + 1];
	char name[IMAGE_NAME_MAX + 1];
	bool cached; /* the digest was here already: nothing unpacked */
	uint64_t ms, layers, entries, bytes, ext4_bytes, special;
};

/* Imports into the images' directory `cachefd` (image_cache_open). 0, or -errno with one line
 * in err; a failed import leaves nothing behind but its log lines. */
int image_import(int cachefd, const struct import_opts *o, struct import_result *res,
		 struct logger *log, char *err, size_t errlen);
#endif
