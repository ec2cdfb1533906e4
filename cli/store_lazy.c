/* cove store lazy NAME --fd N: the fetcher of NAME's memory layers still arriving from the store
 * (lifecycle/store/lazy_fetch.h), started by cove beside the VMM that restores NAME. */
#include "cli/store_sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "lifecycle/name.h"
#include "lifecycle/root.h"
#include "lifecycle/store/lazy_fetch.h"
#include "lifecycle/store/store_config.h"

int store_lazy_cmd(int argc, char **argv)
{
	const char *config = NULL, *name = NULL;
	int sock = -1;
	for (int i = 1; i < argc; i++) {
		char *end;
		if (!strcmp(argv[i], "--config") && i + 1 < argc) {
			config = argv[++i];
		} else if (!strcmp(argv[i], "--fd") && i + 1 < argc) {
			long v = strtol(argv[++i], &end, 10);
			if (*end || v < 3 || v > 1 << 20 || fcntl((int)v, F_GETFD) < 0) {
				fprintf(stderr, "cove store lazy: --fd wants an open descriptor\n");
				return 2;
			}
			sock = (int)v;
		} else if (!name && argv[i][0] != '-') {
			name = argv[i];
		} else {
			fprintf(stderr, "usage: cove store lazy NAME [--fd N] [--config FILE]\n");
			return 2;
		}
	}
	struct logger log = {.level = LOG_INFO, .out = stderr, .name = "cove store lazy"};
	char err[600] = "";
	if (!name || sbx_name_check(name, err, sizeof(err))) {
		log_err(&log, "%s", name ? err : "which sandbox?");
		return 2;
	}
	/* The timeout after which a chunk the guest waits for fails (COVE_LAZY_FETCH_TIMEOUT_S). */
	const char *to = getenv("COVE_LAZY_FETCH_TIMEOUT_S");
	int timeout_s = to ? atoi(to) : 0;
	if (timeout_s < 0 || timeout_s > 3600)
		timeout_s = 0;
	struct store_config *cfg = calloc(1, sizeof(*cfg));
	struct sbx_root root = {.dfd = -1};
	int r = cfg ? store_config_load(config, cfg, err, sizeof(err)) : -ENOMEM;
	if (!r)
		r = sbx_root_open(&root, false, err, sizeof(err));
	int dfd = r ? -1 : sbx_dir_open(&root, name, false, err, sizeof(err));
	if (!r && dfd < 0)
		r = dfd;
	struct lazy_fetch_stats st;
	if (!r) {
		struct lazy_fetch_opts o = {
		    .cfg = cfg, .sbx_dfd = dfd, .sock = sock, .log = &log, .timeout_s = timeout_s};
		r = store_lazy_fetch(&o, &st, err, sizeof(err));
	}
	if (r)
		log_err(&log, "%s: %s", name, err[0] ? err : strerror(-r));
	if (dfd >= 0)
		close(dfd);
	if (root.dfd >= 0)
		sbx_root_close(&root);
	if (cfg)
		store_config_wipe(cfg);
	free(cfg);
	return r ? 1 : 0;
}
