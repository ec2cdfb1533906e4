/* cove store push NAME / cove store pull NAME [--gen N]: a named sandbox to and from the store
 * (lifecycle/store/reconnect.h), run by cove-store. */
#include "cli/store_sandbox.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "lifecycle/root.h"
#include "lifecycle/store/reconnect.h"
#include "lifecycle/store/store_config.h"

int store_sandbox_cmd(int argc, char **argv)
{
	bool push = !strcmp(argv[0], "push");
	const char *config = NULL, *name = NULL;
	uint64_t gen = 0;
	for (int i = 1; i < argc; i++) {
		char *end;
		if (!strcmp(argv[i], "--config") && i + 1 < argc) {
			config = argv[++i];
		} else if (!push && !strcmp(argv[i], "--gen") && i + 1 < argc) {
			gen = strtoull(argv[++i], &end, 10);
			if (*end || !gen) {
				fprintf(stderr, "cove store pull: --gen wants a generation >= 1\n");
				return 2;
			}
		} else if (!name && argv[i][0] != '-') {
			name = argv[i];
		} else {
			fprintf(stderr, "usage: cove store %s NAME [--config FILE]%s\n", argv[0],
				push ? "" : " [--gen N]");
			return 2;
		}
	}
	if (!name) {
		fprintf(stderr, "cove store %s: which sandbox?\n", argv[0]);
		return 2;
	}
	struct logger log = {.level = LOG_INFO, .out = stderr, .name = "cove store"};
	struct store_config *cfg = calloc(1, sizeof(*cfg));
	struct s3_client *c = NULL;
	struct sbx_root root = {.dfd = -1};
	struct store_sync_stats st;
	char err[600];
	int r = cfg ? store_config_load(config, cfg, err, sizeof(err)) : -ENOMEM;
	if (!r)
		r = s3_client_new(cfg, &(struct s3_opts){.log = &log}, &c, err, sizeof(err));
	if (!r)
		r = sbx_root_open(&root, !push, err, sizeof(err));
	if (!r)
		r = push ? store_push_sandbox(c, cfg, &root, name, &st, err, sizeof(err))
			 : store_pull_sandbox(c, cfg, &root, name, gen, &st, err, sizeof(err));
	if (root.dfd >= 0)
		sbx_root_close(&root);
	s3_client_free(c);
	if (cfg)
		store_config_wipe(cfg);
	free(cfg);
	if (r) {
		log_err(&log, "%s", err[0] ? err : strerror(-r));
		/* Gone from the store (tombstone): the exit status cove gives a removed sandbox. */
		return r == -EIDRM ? 66 : 1;
	}
	if (push)
		printf("%s: generation %llu committed: %llu files, %llu blobs sent (%llu bytes), "
		       "%llu already in the store\n",
		       name, (unsigned long long)st.generation, (unsigned long long)st.files,
		       (unsigned long long)st.blobs_sent, (unsigned long long)st.bytes_sent,
		       (unsigned long long)st.blobs_present);
	else
		printf("%s: generation %llu fetched: %llu files, %llu blobs (%llu bytes); stopped, "
		       "ready to start\n",
		       name, (unsigned long long)st.generation, (unsigned long long)st.files,
		       (unsigned long long)st.blobs_sent, (unsigned long long)st.bytes_sent);
	return 0;
}
