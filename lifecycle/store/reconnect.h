/*
 * A named sandbox between this host's state root and the store: push uploads a stopped
 * sandbox's newest generation; pull makes a sandbox this host has never seen from the store's
 * newest (or a given) generation, as a stopped sandbox that `cove start`/`exec` restores. What
 * the manifest names is mapped to this host's own configuration: images to its cache by
 * digest, the key provider type to store.json's key_providers, the policy id to its policies.
 */
#ifndef COVE_LIFECYCLE_STORE_RECONNECT_H
#define COVE_LIFECYCLE_STORE_RECONNECT_H

#include <stdbool.h>
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

/* The follower's lock in a sandbox's directory: held while it may commit. */
#define STORE_FOLLOW_LOCK "store-follow.lock"

/*
 * Uploads stopped sandbox `name` (dfd: its directory) as a generation: with `fenced`, exactly
 * generation base + 1 naming lease epoch `lease` (-ESTALE when that number is taken).
 */
int store_upload_stopped(struct s3_client *c, const struct store_config *cfg,
			 const struct sbx_root *root, const char *name, int dfd, bool fenced,
			 uint64_t base, uint64_t lease, struct store_sync_stats *st, char *err,
			 size_t errlen);

/*
 * Before sandbox `name` (here, stopped) starts on this host: takes its lease and, when it
 * changed hands (or this host never held it), commits generation newest + 1 naming the new
 * lease before the guest runs, so a stale owner's late commit is refused. A copy older than
 * the store's newest is replaced by it first. A keeper thread renews the lease meanwhile (a
 * fetch can outlast its time to live). -EBUSY with *other when another host holds it;
 * -ETIMEDOUT when the lease lapsed before the commit (released, nothing committed).
 */
struct store_lease;
struct logger;
int store_take_sandbox(struct s3_client *c, const struct store_config *cfg,
		       const struct sbx_root *root, const char *name, struct logger *log,
		       struct store_lease *other, char *err, size_t errlen);
/*
 * Replaces stopped sandbox `name`'s chain (dfd: its directory, under its start lock) with
 * generation `gen` of the store, fetched beside it and swapped in whole; its spec and base
 * follow. For a host whose copy is older than the store's newest.
 */
int store_refresh_sandbox(struct s3_client *c, const struct store_config *cfg,
			  const struct sbx_root *root, const char *name, int dfd, uint64_t gen,
			  struct store_sync_stats *st, char *err, size_t errlen);
/*
 * Before a paused sandbox `name` is resumed here (no store traffic: this host's own record):
 * 0 when it holds no lease record, or this host's lease has more than the keeper's margin
 * (clock skew + 3 s) left at now_ms; -EBUSY with *held (this host's record) when the lease is in
 * doubt, i.e. its keeper paused the VM, or released or lost it: only the keeper resumes it.
 */
/*
 * Before cove gc archives or deletes `name` here: 0 when this host owns it (holds its lease,
 * or was the last to hold and release it, or nobody ever leased it); -EBUSY with *cur (the
 * store's lease) when another host holds it or ran it since.
 */
int store_check_owner(struct s3_client *c, const struct store_config *cfg,
		      const struct sbx_root *root, const char *name, struct store_lease *cur,
		      char *err, size_t errlen);
int store_check_held(const struct store_config *cfg, const struct sbx_root *root, const char *name,
		     int64_t now_ms, struct store_lease *held, char *err, size_t errlen);
/* Releases the lease this host holds on `name` (after its final commit). 0 when none held. */
int store_release_sandbox(struct s3_client *c, const struct store_config *cfg,
			  const struct sbx_root *root, const char *name, char *err, size_t errlen);

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
/* What the follower does to the VM when its lease is in doubt (lease_keeper.h). */
struct store_follow_hooks {
	int (*set_paused)(void *arg, bool paused);
	void *arg;
};
int store_follow(struct s3_client *c, const struct store_config *cfg, const struct sbx_root *root,
		 const char *name, struct logger *log, const struct store_follow_hooks *hooks,
		 char *err, size_t errlen);

#endif
