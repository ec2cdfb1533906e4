/* One sandbox as `cove ls --json` and every command's --json describe it (sandbox_json.h). */
#include "cli/sandbox_json.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "common/clock.h"
#include "lifecycle/spec.h"
#include "lifecycle/state.h"
#include "lifecycle/store_stats.h"
#include "lifecycle/tree.h"
#include "lifecycle/vmm_args.h"

/* The age of the newest committed layer (chain.json's mtime), or -1 with none. */
static int64_t snapshot_age_s(int dfd)
{
	struct stat st;

	if (fstatat(dfd, SBX_CHAIN "/chain.json", &st, AT_SYMLINK_NOFOLLOW) < 0)
		return -1;
	return (realtime_ms() -
		((int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000)) /
	       1000;
}

json_t *sbx_describe_json(int dfd, const char *name)
{
	struct sbx_spec *s = calloc(1, sizeof(*s));
	struct sbx_event ev;
	enum sbx_state st;
	json_t *j = NULL;

	if (!s)
		return NULL;
	if (sbx_spec_read(dfd, s, NULL, 0) == 0 && sbx_state_read(dfd, &st, &ev) == 0) {
		uint64_t total = sbx_tree_bytes(dfd, "."), chain = sbx_tree_bytes(dfd, SBX_CHAIN);

		j = json_pack("{s:s,s:s,s:I,s:i,s:I,s:I,s:I,s:I,s:b}", "name", name, "state",
			      sbx_state_name(st), "since_ms",
			      (json_int_t)(ev.time_ms ? ev.time_ms : s->created_ms), "vcpus",
			      s->vcpus, "mem_bytes", (json_int_t)s->mem_bytes, "disk_bytes",
			      (json_int_t)(total - chain), "chain_bytes", (json_int_t)chain,
			      "last_snapshot_age_s", (json_int_t)snapshot_age_s(dfd), "encrypted",
			      s->key[0] != 0);
		/* Its reconnects on this host: from the local copy (hits) or the store (misses) */
		struct store_stats ss;
		if (j && store_stats_load(dfd, &ss) == 0)
			json_object_set_new(j, "cache",
					    json_pack("{s:I,s:I}", "hits",
						      (json_int_t)ss.cache_hits, "misses",
						      (json_int_t)ss.cache_misses));
	}
	free(s);
	return j;
}
