/* Whether a local sandbox's newest state is committed in the store: the rule that lets the
 * cache evict its local copy (lifecycle/cache.h; STORE.md, "The cache"). */
#ifndef COVE_LIFECYCLE_STORE_CACHE_CHECK_H
#define COVE_LIFECYCLE_STORE_CACHE_CHECK_H

#include <stddef.h>

#include "lifecycle/root.h"
#include "lifecycle/store/s3.h"

struct store_config;

/*
 * 0 when sandbox `name` (dfd: its directory, a stopped or crashed one under its start lock) is
 * committed: this host recorded a generation for it (store-base: pulled, or last committed
 * here), that generation is the store's newest (no tombstone), and its MAC'ed manifest restores
 * the very layer the local chain's newest generation ends with (no commit here since). 1 with
 * why in why[whylen] when it is not; -errno + why when the store could not answer.
 */
int store_check_cached(struct s3_client *c, const struct store_config *cfg,
		       const struct sbx_root *root, const char *name, int dfd, char *why,
		       size_t whylen);

#endif
