/*
 * cove store evict: evicts local copies of sandboxes committed in the store, least recently used
 * first, until the state root uses at most the bound (--cache-max, else store.json's
 * "cache_max"; neither: nothing to do). `cove gc` runs it; lifecycle/cache.h has the rules.
 */
#include "cli/store_cache.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "lifecycle/cache.h"
#include "lifecycle/cache_evict.h"
#include "lifecycle/cache_scan.h"
#include "lifecycle/cache_stats.h"
#include "lifecycle/store/cache_check.h"
#include "lifecycle/store/store_config.h"

struct check_arg {
	struct s3_client *c;
	const struct store_config *cfg;
	const struct sbx_root *root;
};

static int committed(void *arg, const char *name, int dfd, char *why, size_t whylen)
{
	struct check_arg *a = arg;
	return store_check_cached(a->c, a->cfg, a->root, name, dfd, why, whylen) ? 1 : 0;
}

static void when(int64_t ms, char *out, size_t cap)
{
	time_t t = (time_t)(ms / 1000);
	struct tm tm;
	gmtime_r(&t, &tm);
	strftime(out, cap, "%Y-%m-%d %H:%M:%S UTC", &tm);
}

/* Marks the candidates the store holds whole; the others keep their reason. */
static void check_all(struct check_arg *a, struct cache_cand *c, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		char why[256] = "";
		c[i].committed = true; /* asked only of those nothing else keeps */
		if (cache_keep_reason(&c[i])) {
			c[i].committed = false;
			continue;
		}
		int dfd = sbx_dir_open(a->root, c[i].name, false, NULL, 0);
		c[i].committed = dfd >= 0 && committed(a, c[i].name, dfd, why, sizeof(why)) == 0;
		if (dfd >= 0)
			close(dfd);
	}
}

static int evict(struct check_arg *a, uint64_t max, bool dry)
{
	struct cache_cand *c = NULL;
	size_t n = 0, k, *order = NULL;
	uint64_t usage = 0, after = 0, freed = 0, evicted = 0;
	char err[600];
	int r = cache_scan(a->root, &c, &n, &usage, err, sizeof(err));

	if (r) {
		fprintf(stderr, "cove gc: cache: %s\n", err);
		return 1;
	}
	if (usage <= max) {
		printf("cove gc: cache: %llu bytes used, at most %llu: nothing to evict\n",
		       (unsigned long long)usage, (unsigned long long)max);
		free(c);
		return 0;
	}
	check_all(a, c, n);
	order = calloc(n ? n : 1, sizeof(*order));
	k = order ? cache_plan(c, n, usage, max, order, &after) : 0;
	int failed = 0;
	for (size_t i = 0; i < k; i++) {
		struct cache_cand *e = &c[order[i]];
		char used[40];
		when(e->last_used_ms, used, sizeof(used));
		if (dry) {
			printf("cove gc: cache: would evict %s: %llu bytes, last used %s\n",
			       e->name, (unsigned long long)e->bytes, used);
			freed += e->bytes;
			continue;
		}
		r = cache_evict(a->root, e->name, committed, a, err, sizeof(err));
		if (r) {
			fprintf(stderr, "cove gc: cache: %s: left alone: %s\n", e->name, err);
			failed += r != -EBUSY && r != -ESTALE;
			continue;
		}
		printf("cove gc: cache: evicted %s: %llu bytes freed, last used %s\n", e->name,
		       (unsigned long long)e->bytes, used);
		fflush(stdout);
		freed += e->bytes;
		evicted++;
	}
	if (evicted)
		cache_stats_add(a->root->dfd, &(struct cache_stats){.evictions = evicted,
								    .evicted_bytes = freed});
	usage -= freed < usage ? freed : usage;
	printf("cove gc: cache: %llu bytes used, at most %llu: %llu %s (%llu bytes)\n",
	       (unsigned long long)(dry ? after : usage), (unsigned long long)max,
	       (unsigned long long)(dry ? k : evicted), dry ? "would be evicted" : "evicted",
	       (unsigned long long)freed);
	if ((dry ? after : usage) > max)
		for (size_t i = 0; i < n; i++) {
			const char *why = cache_keep_reason(&c[i]);
			if (why)
				printf("cove gc: cache: still over the bound: %s kept: %s\n",
				       c[i].name, why);
		}
	free(order);
	free(c);
	return failed ? 1 : 0;
}

int store_evict_cmd(int argc, char **argv)
{
	const char *config = NULL, *flag = NULL;
	bool dry = false;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--config") && i + 1 < argc) {
			config = argv[++i];
		} else if (!strcmp(argv[i], "--cache-max") && i + 1 < argc) {
			flag = argv[++i];
		} else if (!strcmp(argv[i], "--dry-run")) {
			dry = true;
		} else {
			fprintf(stderr, "usage: cove store evict [--cache-max SIZE] [--dry-run] "
					"[--config FILE]\n");
			return 2;
		}
	}
	uint64_t max = 0;
	if (flag && cache_max_parse(flag, &max)) {
		fprintf(stderr, "cove gc: --cache-max: bad size '%s' (at least 1M: 512M, 2G)\n",
			flag);
		return 2;
	}
	struct logger log = {.level = LOG_INFO, .out = stderr, .name = "cove store"};
	struct store_config *cfg = calloc(1, sizeof(*cfg));
	struct s3_client *c = NULL;
	struct sbx_root root = {.dfd = -1};
	char err[600] = "";
	int r = cfg ? store_config_load(config, cfg, err, sizeof(err)) : -ENOMEM;
	if (!r && !flag)
		max = cfg->cache_max;
	if (!r && !max) {
		/* No bound set: the cache may grow. */
		store_config_wipe(cfg);
		free(cfg);
		return 0;
	}
	if (!r && !cfg->fleet_key_len)
		r = -ENOKEY, snprintf(err, sizeof(err), "store.json names no fleet_key_file");
	if (!r)
		r = s3_client_new(cfg, &(struct s3_opts){.log = &log}, &c, err, sizeof(err));
	if (!r)
		r = sbx_root_open(&root, false, err, sizeof(err));
	int st = 1;
	if (!r) {
		struct check_arg a = {.c = c, .cfg = cfg, .root = &root};
		st = evict(&a, max, dry);
		sbx_root_close(&root);
	} else if (r == -ENOENT && root.dfd < 0 && c) {
		st = 0; /* no state root: nothing cached */
	} else {
		fprintf(stderr, "cove gc: cache: %s\n", err[0] ? err : strerror(-r));
	}
	s3_client_free(c);
	if (cfg)
		store_config_wipe(cfg);
	free(cfg);
	return st;
}
