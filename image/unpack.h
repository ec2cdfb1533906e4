/* One image layer (a tar, plain or gzip/zstd/xz/bzip2-compressed) applied to the root being
 * built: whiteouts first, then the entries, each beneath the root and never through a link. */
#ifndef COVE_IMAGE_UNPACK_H
#define COVE_IMAGE_UNPACK_H
#include "common/log.h"
#include "image/digest.h"

#include <stdint.h>

/* What a layer blob must be: its bytes' SHA-256 and its exact size (from the manifest, or for
 * a docker-archive the config's diff_id and the file's size). */
struct layer_src {
	int fd;
	uint64_t size;
	char hex[DIGEST_HEX + 1];
	int index; /* 1-based, for messages */
};

/* Caps for the whole image, counted down across its layers. */
struct unpack_budget {
	uint64_t bytes_left;   /* file bytes (logical sizes) the image may still unpack */
	uint64_t entries_left; /* entries it may still have */
};

struct unpack_stats {
	uint64_t entries, files, dirs, symlinks, hardlinks, whiteouts, opaque;
	uint64_t bytes;	  /* file bytes written (logical sizes) */
	uint64_t special; /* device nodes, fifos and sockets skipped */
	uint64_t xattrs_kept, xattrs_skipped;
};

/*
 * Applies the layer to rootfd (a directory this process made and alone writes). 0, or -errno
 * with one line in err naming the layer and the entry; the root is then half-built and the
 * caller discards it. Refused: an absolute or '..' path, an entry (or a whiteout, or a hard
 * link's target) whose path goes through a symlink, a blob bigger than its size or with
 * another digest, more bytes or entries than the budget has. Device nodes, fifos and sockets
 * are skipped (one log line per layer), as are xattrs other than user.* and
 * security.capability.
 */
int unpack_layer(int rootfd, const struct layer_src *src, struct unpack_budget *b,
		 struct unpack_stats *st, struct logger *log, char *err, size_t errlen);
#endif
