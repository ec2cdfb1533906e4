/* Whole directory trees beneath a directory fd, never through a link: size and removal. */
#ifndef COVE_LIFECYCLE_TREE_H
#define COVE_LIFECYCLE_TREE_H

#include <stdint.h>

/* Bytes allocated on disk (st_blocks) by `name` in dfd and everything below it; 0 if absent. */
uint64_t sbx_tree_bytes(int dfd, const char *name);

/* Removes `name` in dfd and everything below it (links are removed, never followed). 0, or
 * -errno of the first failure (what could be removed is). */
int sbx_tree_remove(int dfd, const char *name);

#endif
