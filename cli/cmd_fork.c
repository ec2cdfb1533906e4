/* `cove fork SANDBOX -n N`: N clones of a running sandbox, each with its own sockets, CID, chain
 * and a fresh guest identity. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/api_client.h"
#include "cli/commands.h"

static const char usage[] =
    "usage: cove fork API_SOCK [-n N] [--no-identity]\n"
    "Snapshot a running sandbox (it needs --snapshot-dir) and start N clones (1..16, default 1)\n"
    "restored from it, as PUT /fork does. Unchanged memory is shared copy-on-write. Each clone\n"
    "gets its own API socket, vsock socket and CID, its own snapshot directory, and (unless\n"
    "--no-identity) a fresh identity through its guest agent before it is reported: a new RNG\n"
    "seed and the host's clock. Prints one JSON object with the clones; exits 1 when a clone's\n"
    "identity was not delivered (its \"identity\" says why).\n";

int cmd_fork(int argc, char **argv)
{
	const char *sock = NULL;
	long n = 1;
	bool identity = true;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			fputs(usage, stdout);
			return 0;
		} else if (!strcmp(argv[i], "-n") && i + 1 < argc) {
			char *end;
			n = strtol(argv[++i], &end, 10);
			if (*end || n < 1 || n > 16) {
				fprintf(stderr, "cove fork: -n must be 1..16\n");
				return 2;
			}
		} else if (!strcmp(argv[i], "--no-identity")) {
			identity = false;
		} else if (argv[i][0] != '-' && !sock) {
			sock = argv[i];
		} else {
			fprintf(stderr, "cove fork: unexpected argument '%s' (try --help)\n",
				argv[i]);
			return 2;
		}
	}
	if (!sock) {
		fprintf(stderr, "cove fork: the sandbox's API socket is required (try --help)\n");
		return 2;
	}
	char body[64], err[512];
	snprintf(body, sizeof(body), "{\"count\":%ld,\"identity\":%s}", n,
		 identity ? "true" : "false");
	long status;
	char *reply;
	if (api_call(sock, "PUT", "/fork", body, 600, &status, &reply, err, sizeof(err))) {
		fprintf(stderr, "cove fork: %s\n", err);
		return 1;
	}
	if (status != 200) {
		api_fault_text(reply, err, sizeof(err));
		fprintf(stderr, "cove fork: %s\n", err);
		free(reply);
		return 1;
	}
	/* The sandbox gave each clone its identity (PUT /fork): report what it says. */
	json_t *j = json_loads(reply, 0, NULL);
	json_t *clones = json_object_get(j, "clones");
	int rc = 0;
	size_t i;
	json_t *c;
	json_array_foreach(clones, i, c)
	{
		const char *id = json_string_value(json_object_get(c, "identity"));
		if (identity && (!id || strcmp(id, "sent"))) {
			fprintf(stderr, "cove fork: clone %lld: identity %s\n",
				(long long)json_integer_value(json_object_get(c, "pid")),
				id ? id : "unknown");
			rc = 1;
		}
	}
	char *out = json_dumps(j ? j : json_null(), JSON_COMPACT);
	printf("%s\n", out ? out : reply);
	free(out);
	json_decref(j);
	free(reply);
	return rc;
}
