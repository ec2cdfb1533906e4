/* Whether a local copy is committed in the store (cache_check.h). */
#include "lifecycle/store/cache_check.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errmsg.h"
#include "lifecycle/store/lease.h"
#include "lifecycle/store/store_config.h"
#include "lifecycle/store/sync.h"
#include "lifecycle/vmm_args.h"
#include "snapshot/chain.h"

/* The id of the newest layer of the local chain's newest generation; 0 without one. */
static uint64_t local_layer(const struct sbx_root *root, const char *name)
{
	struct chain *c = calloc(1, sizeof(*c));
	char dir[PATH_MAX + 64], err[256];
	uint64_t id = 0;

	snprintf(dir, sizeof(dir), "%s/%s/" SBX_CHAIN, root->state, name);
	if (c && chain_load(dir, c, err, sizeof(err)) == 0 && chain_latest(c))
		id = chain_latest(c)->id;
	free(c);
	return id;
}

int store_check_cached(struct s3_client *c, const struct store_config *cfg,
		       const struct sbx_root *root, const char *name, int dfd, char *why,
		       size_t whylen)
{
	uint64_t base = 0, newest = 0, layer;
	struct store_manifest m;
	int r = store_base_load(dfd, &base);

	if (r == -ENOENT || (!r && !base))
		return errmsg(why, whylen, 1, "no generation of it was committed or pulled here");
	if (r)
		return errmsg(why, whylen, r, "%s: %s", STORE_BASE_FILE, strerror(-r));
	r = store_newest_generation(c, name, &newest, why, whylen);
	if (r == -EIDRM)
		return errmsg(why, whylen, 1, "the store has its tombstone");
	if (r)
		return r;
	if (newest != base)
		return errmsg(why, whylen, 1,
			      "this host's copy is generation %llu, the store's newest %llu",
			      (unsigned long long)base, (unsigned long long)newest);
	layer = local_layer(root, name);
	if (!layer)
		return errmsg(why, whylen, 1, "its local chain has no readable generation");
	struct store_keyring kr = {cfg->fleet_key, cfg->fleet_key_len};
	r = store_manifest_fetch(c, name, base, &kr, &m, why, whylen);
	if (r)
		return r;
	uint64_t stored = m.layer;
	store_manifest_free(&m);
	if (stored != layer)
		return errmsg(why, whylen, 1,
			      "its local chain ends with layer %llu, generation %llu with layer "
			      "%llu: a commit here is not in the store",
			      (unsigned long long)layer, (unsigned long long)base,
			      (unsigned long long)stored);
	return 0;
}
