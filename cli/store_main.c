/* cove-store: the object store commands (`cove store ...` execs it), a dynamic helper beside
 * cove so that neither the static cove binary nor cove-vmm maps libcurl or libxml2. */
#include "cli/store_cache.h"
#include "cli/store_put.h"
#include "cli/store_sandbox.h"
#include "common/log.h"
#include "lifecycle/store/s3.h"
#include "lifecycle/store/store_probe.h"

#include <curl/curl.h>
#include <libxml/parser.h>
#include <stdio.h>
#include <string.h>

static void usage(FILE *out)
{
	fprintf(out,
		"usage: cove store probe [--config FILE]\n"
		"       cove store push NAME [--template] [--config FILE]\n"
		"       cove store pull NAME [--gen N] [--template] [--config FILE]\n"
		"  --template: NAME is a template (cove template): its own prefix in the store "
		"(templates/NAME/), fetched whole\n"
		"  push: uploads stopped sandbox NAME's newest generation (blobs the store has "
		"are not sent again)\n"
		"  pull: makes sandbox NAME on this host from the store's newest generation\n"
		"       cove store follow NAME [--config FILE]\n"
		"       cove store lazy NAME [--fd N] [--config FILE]\n"
		"  lazy: fetches the memory layers of NAME still arriving from the store (cove "
		"starts it "
		"beside the VMM; --fd: the VMM's socket)\n"
		"  follow: while NAME runs, uploads each new commit of its chain (cove start "
		"runs it when a store is configured)\n"
		"       cove store ls [--json] [--config FILE]\n"
		"  ls: the store's sandboxes: newest generation, generations kept, its age (the "
		"store lag), stored or removed\n"
		"       cove store tombstone NAME [--config FILE]\n"
		"       cove store take NAME [--config FILE]\n"
		"  take: takes NAME's lease for this host before it starts here (exit 75 and one "
		"JSON line when another host holds it)\n"
		"       cove store release NAME [--config FILE]\n"
		"  release: releases the lease this host holds on NAME (after its final commit)\n"
		"       cove store held NAME [--config FILE]\n"
		"  held: before a paused NAME resumes here: exit 75 and one JSON line when this "
		"host's lease is in doubt (its keeper paused it; no store traffic)\n"
		"       cove store owner NAME [--config FILE]\n"
		"  owner: before cove gc archives or deletes NAME: exit 75 and one JSON line when "
		"another host holds its lease or ran it since this host\n"
		"  tombstone: NAME is removed for every host (cove rm writes it first)\n"
		"       cove store put FILE KEY [--config FILE]\n"
		"  put: uploads FILE as object KEY (under the store's prefix) the way layers go "
		"up; one JSON line\n"
		"       cove store gc [--keep K] [--grace SECONDS] [--config FILE]\n"
		"  gc: keeps each sandbox's newest K generations (8; none of a removed one) and "
		"deletes blobs none of them names once older than the grace period (86400 s)\n"
		"       cove store evict [--cache-max SIZE] [--dry-run] [--config FILE]\n"
		"  evict: evicts local copies of stopped sandboxes committed in the store, least "
		"recently used first, until the state root uses at most SIZE (default store.json's "
		"cache_max; cove gc runs it)\n"
		"  probe: checks that the store in FILE (default $COVE_STORE, else "
		"/etc/cove/store.json)\n"
		"  answers a second create-only PUT (If-None-Match: *) with 412\n");
}

static int store_probe_cmd(int argc, char **argv)
{
	const char *config = NULL;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--config") && i + 1 < argc) {
			config = argv[++i];
		} else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage(stdout);
			return 0;
		} else {
			usage(stderr);
			return 2;
		}
	}
	struct logger log = {.level = LOG_INFO, .out = stderr, .name = "cove store"};
	struct store_config cfg;
	struct s3_client *c = NULL;
	char err[600];
	int r = store_config_load(config, &cfg, err, sizeof(err));
	if (!r) {
		struct s3_opts o = {.log = &log};
		r = s3_client_new(&cfg, &o, &c, err, sizeof(err));
		store_config_wipe(&cfg);
	}
	if (!r)
		r = store_probe(c, err, sizeof(err));
	s3_client_free(c);
	if (r) {
		log_err(&log, "%s", err);
		return 1;
	}
	printf("store probe: ok: create-only writes are honoured (412 on the second PUT)\n");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (strcmp(argv[1], "probe") && strcmp(argv[1], "push") && strcmp(argv[1], "pull") &&
	    strcmp(argv[1], "tombstone") && strcmp(argv[1], "follow") && strcmp(argv[1], "ls") &&
	    strcmp(argv[1], "gc") && strcmp(argv[1], "take") && strcmp(argv[1], "release") &&
	    strcmp(argv[1], "held") && strcmp(argv[1], "owner") && strcmp(argv[1], "lazy") &&
	    strcmp(argv[1], "evict") && strcmp(argv[1], "put")) {
		fprintf(stderr, "cove store: unknown command '%s'\n", argv[1]);
		usage(stderr);
		return 2;
	}
	curl_global_init(CURL_GLOBAL_DEFAULT);
	xmlInitParser();
	int r = !strcmp(argv[1], "probe")   ? store_probe_cmd(argc - 1, argv + 1)
		: !strcmp(argv[1], "gc")    ? store_gc_cmd(argc - 1, argv + 1)
		: !strcmp(argv[1], "ls")    ? store_ls_cmd(argc - 1, argv + 1)
		: !strcmp(argv[1], "lazy")  ? store_lazy_cmd(argc - 1, argv + 1)
		: !strcmp(argv[1], "evict") ? store_evict_cmd(argc - 1, argv + 1)
		: !strcmp(argv[1], "put")   ? store_put_cmd(argc - 1, argv + 1)
					    : store_sandbox_cmd(argc - 1, argv + 1);
	xmlCleanupParser();
	curl_global_cleanup();
	return r;
}
