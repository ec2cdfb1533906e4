/* `cove snapshot SANDBOX`: ask a running sandbox for a full or incremental snapshot and print what
 * it wrote. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/api_client.h"
#include "cli/commands.h"

static const char usage[] =
    "usage: cove snapshot API_SOCK [--full|--diff] [--dir DIR]\n"
    "Snapshot a running sandbox through its control socket (cove run --api-sock).\n"
    "  --full     every page; starts a new chain (the default the first time)\n"
    "  --diff     only pages written since the previous layer (default after the first)\n"
    "  --dir DIR  chain directory (default: the sandbox's --snapshot-dir)\n"
    "Prints the result as JSON: layer_id, pages, stored_pages, bytes, pause_us, write_us.\n";

int cmd_snapshot(int argc, char **argv)
{
	const char *sock = NULL, *dir = NULL;
	int mode = 0; /* 0 auto, 1 full, 2 diff */
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			fputs(usage, stdout);
			return 0;
		} else if (!strcmp(argv[i], "--full")) {
			mode = 1;
		} else if (!strcmp(argv[i], "--diff")) {
			mode = 2;
		} else if (!strcmp(argv[i], "--dir") && i + 1 < argc) {
			dir = argv[++i];
		} else if (argv[i][0] != '-' && !sock) {
			sock = argv[i];
		} else {
			fprintf(stderr, "cove snapshot: unexpected argument '%s' (try --help)\n",
				argv[i]);
			return 2;
		}
	}
	if (!sock) {
		fprintf(stderr,
			"cove snapshot: the sandbox's API socket is required (try --help)\n");
		return 2;
	}
	char err[512], fault[512];
	for (int attempt = 0; attempt < 2; attempt++) {
		const char *type = mode == 1 || attempt == 1 ? "Full" : "Diff";
		json_t *req = json_pack("{s:s}", "snapshot_type", type);
		if (dir)
			json_object_set_new(req, "snapshot_dir", json_string(dir));
		char *body = json_dumps(req, JSON_COMPACT);
		json_decref(req);
		long status;
		char *reply;
		int r = api_call(sock, "PUT", "/snapshot/create", body, 3600, &status, &reply, err,
				 sizeof(err));
		free(body);
		if (r) {
			fprintf(stderr, "cove snapshot: %s\n", err);
			return 1;
		}
		if (status == 200) {
			printf("%s\n", reply);
			free(reply);
			return 0;
		}
		api_fault_text(reply, fault, sizeof(fault));
		free(reply);
		/* No base yet and the user did not insist on --diff: take the full one. */
		if (mode == 0 && attempt == 0 && strstr(fault, "take a Full snapshot first"))
			continue;
		fprintf(stderr, "cove snapshot: %s\n", fault);
		return 1;
	}
	return 1;
}
