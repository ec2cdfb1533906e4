/* `cove ls [--json]`: every sandbox `cove create` made, with its state and sizes. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/commands.h"
#include "cli/json_mode.h"
#include "cli/sandbox_json.h"
#include "cli/store_reconnect.h"
#include "common/clock.h"
#include "lifecycle/cache_scan.h"
#include "lifecycle/cache_stats.h"
#include "lifecycle/gc.h"
#include "lifecycle/name.h"
#include "lifecycle/root.h"
#include "lifecycle/spec.h"
#include "lifecycle/state.h"
#include "lifecycle/store_stats.h"
#include "lifecycle/tree.h"
#include "lifecycle/vmm_args.h"

/*
 * With a store configured: each local sandbox gets "store" ({"newest", "lag_s", "state"} from
 * `cove-store ls --json`, null when the store has no generation of it), and a sandbox only the
 * store holds is listed with state "remote" (any cove exec of it pulls it here). The catalog is
 * checked field by field; a store that cannot be listed costs one line on stderr, not the list.
 */
static void merge_store(json_t *all)
{
	char *text = NULL;
	int r = store_try_list(&text);
	if (r < 0)
		return;
	json_t *cat = r == 0 ? json_loads(text, JSON_REJECT_DUPLICATES, NULL) : NULL;
	free(text);
	if (!json_is_array(cat)) {
		fprintf(stderr, "cove ls: the store could not be listed; local sandboxes only\n");
		json_decref(cat);
		return;
	}
	size_t i, k;
	json_t *j, *c;
	json_array_foreach(all, i, j) json_object_set_new(j, "store", json_null());
	json_array_foreach(cat, k, c)
	{
		const char *name = json_string_value(json_object_get(c, "name"));
		const char *state = json_string_value(json_object_get(c, "state"));
		json_t *newest = json_object_get(c, "newest"), *lag = json_object_get(c, "lag_s");
		if (!name || sbx_name_check(name, NULL, 0) || !state || !json_is_integer(newest) ||
		    !json_is_integer(lag))
			continue;
		json_t *info =
		    json_pack("{s:O,s:O,s:s}", "newest", newest, "lag_s", lag, "state", state);
		bool local = false;
		json_array_foreach(all, i, j)
		{
			if (!strcmp(json_string_value(json_object_get(j, "name")), name)) {
				json_object_set(j, "store", info);
				local = true;
			}
		}
		if (!local && !strcmp(state, "stored"))
			json_array_append_new(all, json_pack("{s:s,s:s,s:O}", "name", name, "state",
							     "remote", "store", info));
		json_decref(info);
	}
	json_decref(cat);
}

static void human(uint64_t b, char *out, size_t cap)
{
	if (b >= (1ULL << 30))
		snprintf(out, cap, "%.1fG", (double)b / (1 << 30));
	else
		snprintf(out, cap, "%.1fM", (double)b / (1 << 20));
}

static void print_row(json_t *j)
{
	char since[32] = "-", mem[32] = "-", disk[32] = "-", chain[32] = "-", age[40] = "-",
	     lag[40] = "-";
	json_t *st = json_object_get(j, "store");
	if (json_is_object(st)) {
		int64_t l = json_integer_value(json_object_get(st, "lag_s"));
		if (!strcmp(json_string_value(json_object_get(st, "state")), "removed"))
			snprintf(lag, sizeof(lag), "removed");
		else if (l >= 0)
			snprintf(lag, sizeof(lag), "%llds", (long long)l);
	}
	if (!json_object_get(j, "since_ms")) {
		printf("%-20s %-9s %-16s %5s %7s %8s %8s  %-14s %s\n",
		       json_string_value(json_object_get(j, "name")),
		       json_string_value(json_object_get(j, "state")), since, "-", mem, disk, chain,
		       age, lag);
		return;
	}
	int64_t s = json_integer_value(json_object_get(j, "since_ms"));
	int64_t a = json_integer_value(json_object_get(j, "last_snapshot_age_s"));
	time_t t = (time_t)(s / 1000);
	struct tm tm;

	gmtime_r(&t, &tm);
	strftime(since, sizeof(since), "%Y-%m-%d %H:%M", &tm);
	human((uint64_t)json_integer_value(json_object_get(j, "mem_bytes")), mem, sizeof(mem));
	human((uint64_t)json_integer_value(json_object_get(j, "disk_bytes")), disk, sizeof(disk));
	human((uint64_t)json_integer_value(json_object_get(j, "chain_bytes")), chain,
	      sizeof(chain));
	if (a < 0)
		;
	else
		snprintf(age, sizeof(age), "%llds ago", (long long)a);
	printf("%-20s %-9s %-16s %5lld %7s %8s %8s  %-14s %s\n",
	       json_string_value(json_object_get(j, "name")),
	       json_string_value(json_object_get(j, "state")), since,
	       (long long)json_integer_value(json_object_get(j, "vcpus")), mem, disk, chain, age,
	       lag);
}

static int add_one(const char *name, int dfd, void *arg)
{
	json_t *j = sbx_describe_json(dfd, name);
	if (j)
		json_array_append_new(arg, j);
	return 0;
}

/*
 * `cove ls --cache [--json]`: this host's cache of the store, one JSON object: {"v": 1,
 * "command": "ls --cache", "usage_bytes" (the state root, hard links once),
 * "hits", "misses", "evictions", "evicted_bytes" (lifecycle/cache_stats.h), "sandboxes":
 * [{"name", "state", "last_used_ms", "own_bytes" (what evicting it would free)}]}.
 */
static int print_cache(bool as_json)
{
	struct sbx_root r;
	struct cache_cand *c = NULL;
	struct cache_stats cs = {0};
	size_t n = 0;
	uint64_t usage = 0;
	char err[512];

	if (sbx_root_open(&r, false, err, sizeof(err)) == 0) {
		int ret = cache_scan(&r, &c, &n, &usage, err, sizeof(err));
		cache_stats_load(r.dfd, &cs);
		sbx_root_close(&r);
		if (ret) {
			fprintf(stderr, "cove ls: %s\n", err);
			return 1;
		}
	}
	if (as_json) {
		json_t *all = json_array();
		for (size_t i = 0; i < n; i++)
			json_array_append_new(all, json_pack("{s:s,s:s,s:I,s:I}", "name", c[i].name,
							     "state", sbx_state_name(c[i].state),
							     "last_used_ms",
							     (json_int_t)c[i].last_used_ms,
							     "own_bytes", (json_int_t)c[i].bytes));
		json_mode_print("ls --cache",
				json_pack("{s:I,s:I,s:I,s:I,s:I,s:o}", "usage_bytes",
					  (json_int_t)usage, "hits", (json_int_t)cs.hits, "misses",
					  (json_int_t)cs.misses, "evictions",
					  (json_int_t)cs.evictions, "evicted_bytes",
					  (json_int_t)cs.evicted_bytes, "sandboxes", all));
	} else {
		char u[32], e[32];
		human(usage, u, sizeof(u));
		human(cs.evicted_bytes, e, sizeof(e));
		printf("cache: %s used; %llu hits, %llu misses; %llu evictions (%s)\n", u,
		       (unsigned long long)cs.hits, (unsigned long long)cs.misses,
		       (unsigned long long)cs.evictions, e);
	}
	free(c);
	return 0;
}

int cmd_ls(int argc, char **argv)
{
	bool as_json = false, cache = false, bad = false;
	struct sbx_root r;
	json_t *all;
	char err[512];

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json"))
			as_json = true;
		else if (!strcmp(argv[i], "--cache"))
			cache = true;
		else
			bad = true;
	}
	if (bad) {
		bool help = argc == 2 && !strcmp(argv[1], "--help");
		fprintf(
		    help ? stdout : stderr,
		    "usage: cove ls [--json] [--cache]\n"
		    "Every sandbox of this host (and of the store, when one is configured).\n"
		    "  --cache  this host's cache of the store instead\n"
		    "  --json   one JSON object, shapes \"ls\" and \"ls --cache\" in docs/CLI.md "
		    "(\"JSON output\")\n");
		return help ? 0 : 2;
	}
	if (cache)
		return print_cache(as_json);
	all = json_array();
	if (sbx_root_open(&r, false, err, sizeof(err)) == 0) {
		/* deadlines, in passing: ls shows what is left */
		sbx_gc(&r, false, true, store_gc_hooks());
		sbx_root_each(&r, add_one, all);
		sbx_root_close(&r);
	}
	merge_store(all);
	if (as_json) {
		/* docs/CLI.md's shape "ls": the sandboxes, each as "sandbox" */
		json_mode_print("ls", json_pack("{s:O}", "sandboxes", all));
	} else {
		size_t i;
		json_t *j;

		printf("%-20s %-9s %-16s %5s %7s %8s %8s  %-14s %s\n", "NAME", "STATE",
		       "SINCE (UTC)", "VCPUS", "MEM", "DISK", "CHAIN", "LAST SNAPSHOT",
		       "STORE LAG");
		json_array_foreach(all, i, j) print_row(j);
	}
	json_decref(all);
	return 0;
}
