/* `cove fork SANDBOX -n N`: N clones of a running sandbox, each with its own sockets, CID, chain and a fresh guest identity. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <jansson.h>

#include "agent_client.h"
#include "api_client.h"
#include "commands.h"

static const char usage[] =
	"usage: cove fork API_SOCK [-n N] [--no-identity] [--identity-wait SECONDS]\n"
	"Snapshot a running sandbox (it needs --snapshot-dir) and start N clones (1..16, default 1)\n"
	"restored from it. Unchanged memory is shared copy-on-write. Each clone gets its own API\n"
	"socket, vsock socket and CID, its own snapshot directory, and (unless --no-identity) an\n"
	"identity event through the guest agent: a new RNG seed and the host's clock.\n"
	"Prints one JSON object with the clones.\n";

int cmd_fork(int argc, char **argv)
{
	const char *sock = NULL;
	long n = 1;
	bool identity = true;
	double wait_s = 10;
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
		} else if (!strcmp(argv[i], "--identity-wait") && i + 1 < argc) {
			wait_s = atof(argv[++i]);
		} else if (argv[i][0] != '-' && !sock) {
			sock = argv[i];
		} else {
			fprintf(stderr, "cove fork: unexpected argument '%s' (try --help)\n", argv[i]);
			return 2;
		}
	}
	if (!sock) {
		fprintf(stderr, "cove fork: the sandbox's API socket is required (try --help)\n");
		return 2;
	}
	char body[64], err[512];
	snprintf(body, sizeof(body), "{\"count\":%ld}", n);
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
	json_t *j = json_loads(reply, 0, NULL);
	json_t *clones = json_object_get(j, "clones");
	int rc = 0;
	if (identity && json_is_array(clones)) {
		size_t i;
		json_t *c;
		json_array_foreach(clones, i, c)
		{
			const char *uds = json_string_value(json_object_get(c, "vsock_uds"));
			if (!uds || !*uds)
				continue;
			/*
			 * A fresh random token at epoch 0: the clone's old broker grant is void; the
			 * host re-grants through cove-broker when the clone should use credentials.
			 */
			uint8_t tok[16];
			char hex[33];
			if (getrandom(tok, sizeof(tok), 0) != sizeof(tok)) {
				rc = 1;
				continue;
			}
			for (int b = 0; b < 16; b++)
				snprintf(hex + 2 * b, 3, "%02x", tok[b]);
			int r = agent_send_identity(uds, 0, hex, err, sizeof(err));
			json_object_set_new(c, "identity", json_string(r ? err : "sent"));
			if (r)
				rc = 1;
		}
	}
	(void)wait_s;
	char *out = json_dumps(j ? j : json_null(), JSON_COMPACT);
	printf("%s\n", out ? out : reply);
	free(out);
	json_decref(j);
	free(reply);
	return rc;
}
