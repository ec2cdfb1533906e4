/*
 * A named sandbox between this host's state root and the store: push uploads a stopped
 * sandbox's newest generation; pull makes a sandbox this host has never seen from the store's
 * newest (or a given) generation, as a stopped sandbox that `cove start`/`exec` restores. What
 * the manifest names is mapped to this host's own configuration: images to its cache by
 * digest, the key provider type to store.json's key_providers, the policy id to its policies.
 */
#ifndef COVE_LIFECYCLE_STORE_RECONNECT_H
#define COVE_LIFECYCLE_STORE_RECONNECT_H

#include <stddef.h>
#include <stdint.h>

#include "lifecycle/root.h"
#include "common/log.h"
#include "lifecycle/store/sync.h"

#define STORE_IMAGES_DIR ".images"	/* in the state root: kernels and disk bases by digest */
#define STORE_STAGE_DIR	 ".store-stage" /* in the state root: blobs being packed */

/* The fleet key, key providers and policies of cfg (the host's store.json). */
struct store_config;

/* Uploads stopped sandbox `name` (its start lock held meanwhile). -EBUSY when it runs. */
int store_push_sandbox(struct s3_client *c, const struct store_config *cfg,
		       const struct sbx_root *root, const char *name, struct store_sync_stats *st,
		       char *err, size_t errlen);

/*
 * Makes sandbox `name` here from generation `gen` (0: newest) of the store: fetched into a
 * hidden directory of the root and renamed into place only when whole. -EEXIST when this
 * host has a sandbox of that name; -EIDRM when the store has its tombstone.
 */
int store_pull_sandbox(struct s3_client *c, const struct store_config *cfg,
		       const struct sbx_root *root, const char *name, uint64_t gen,
		       struct store_sync_stats *st, char *err, size_t errlen);

/* The id store.json's "policies" give a policy file (*id "" for none; -ENOENT when absent). */
int store_policy_id_of(const struct store_config *cfg, const char *path, const char **id, char *err,
		       size_t errlen);
/* The provider type of a --key spec: "" (none), "pkcs11" or "key-cmd". */
const char *store_key_type_of(const char *spec);

/*
 * While sandbox `name` runs: uploads each new commit of its chain (inotify on the chain
 * directory, checked every 2 s too), files unchanged since the last upload neither hashed nor
 * sent again; returns once its VMM is gone (the final generation is cove stop's). One follower
 * per sandbox (a lock in its directory: a second returns 0 at once). 0 or -errno + err.
 */
int store_follow(struct s3_client *c, const struct store_config *cfg, const struct sbx_root *root,
		 const char *name, struct logger *log, char *err, size_t errlen);

#endif
