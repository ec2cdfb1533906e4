/*
 * A generation's files, between a chain directory and the store: which files make up the
 * newest generation of a chain, each packed into a blob (hashed from the bytes packed, and
 * checked against the digest the chain records), and a fetched blob checked and placed as the
 * file it holds. Host side, outside the jail.
 */
#ifndef COVE_LIFECYCLE_STORE_STAGE_H
#define COVE_LIFECYCLE_STORE_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "lifecycle/store/blob.h"
#include "lifecycle/store/manifest.h"

#define STORE_STAGE_MAX_FILES 2048

/*
 * The files of DIR's newest valid generation: every file it records a digest for (memory and
 * state layers, frozen disk layers and their maps), the keys file and layer id counter when
 * present, and last the generation file itself (chain.json or chain.N.json). names[max]; *n.
 * *layer: the newest layer's id. 0 or -errno with one line in err (-ENOENT: no chain).
 */
int store_stage_list(const char *dir, char (*names)[STORE_FILE_NAME_MAX], size_t max, size_t *n,
		     uint64_t *layer, char *err, size_t errlen);

/*
 * Packs `name` beneath src_dfd (a regular file, never through a link) into a new unnamed
 * file of stage_dfd (*blob_fd, *blob_len). f gets the name, size and digest of the bytes
 * packed; when the chain records a digest for the name (`recorded`, NULL: none) they must
 * match, else -EBADMSG naming the file: a layer changed since its commit is never uploaded.
 */
int store_stage_file(int src_dfd, const char *name, const uint8_t *recorded, int stage_dfd,
		     struct store_file *f, int *blob_fd, uint64_t *blob_len, char *err,
		     size_t errlen);

/* The same for an open file (the sandbox's kernel or a disk base), stored under the name `as`;
 * with `chunks`, also its chunks' SHA-256s (malloc'ed, store_blob_pack). */
int store_stage_fd(int in, const char *as, const uint8_t *recorded, int stage_dfd,
		   struct store_file *f, int *blob_fd, uint64_t *blob_len, uint8_t **chunks,
		   char *err, size_t errlen);

/*
 * Checks a fetched blob against the manifest's entry f (digest and size) and writes the file it
 * holds as f->name beneath dst_dfd: a temporary file, synced, renamed without replacing. A
 * name that exists is -EEXIST. 0 or -errno with one line in err naming the file.
 */
int store_place_file(int blob_fd, uint64_t blob_len, const struct store_file *f, int dst_dfd,
		     char *err, size_t errlen);

#endif
