/* `cove balloon API_SOCK [--target MIB] [--stats]`: read a sandbox's balloon or set its target. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/api_client.h"
#include "cli/commands.h"

static const char usage[] =
    "usage: cove balloon API_SOCK [--target MIB] [--stats]\n"
    "Show or steer a sandbox's virtio-balloon (cove run --balloon) through its control socket.\n"
    "  (no option)   print GET /balloon: target, actual, bytes free page reporting gave back\n"
    "  --target MIB  ask the guest to inflate (or deflate) its balloon to MIB\n"
    "  --stats       print the guest's memory statistics (GET /balloon/statistics)\n";

static int call(const char *sock, const char *method, const char *path, const char *body)
{
	char err[512], fault[512];
	long status;
	char *reply = NULL;
	if (api_call(sock, method, path, body, 30, &status, &reply, err, sizeof(err))) {
		fprintf(stderr, "cove balloon: %s\n", err);
		return 1;
	}
	if (status / 100 != 2) {
		api_fault_text(reply, fault, sizeof(fault));
		fprintf(stderr, "cove balloon: %s\n", fault);
		free(reply);
		return 1;
	}
	if (reply && *reply)
		printf("%s\n", reply);
	free(reply);
	return 0;
}

int cmd_balloon(int argc, char **argv)
{
	const char *sock = NULL, *target = NULL;
	int stats = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			fputs(usage, stdout);
			return 0;
		} else if (!strcmp(argv[i], "--target") && i + 1 < argc) {
			target = argv[++i];
		} else if (!strcmp(argv[i], "--stats")) {
			stats = 1;
		} else if (argv[i][0] != '-' && !sock) {
			sock = argv[i];
		} else {
			fprintf(stderr, "cove balloon: unexpected argument '%s' (try --help)\n",
				argv[i]);
			return 2;
		}
	}
	if (!sock) {
		fprintf(stderr,
			"cove balloon: the sandbox's API socket is required (try --help)\n");
		return 2;
	}
	if (target) {
		char *end;
		unsigned long long mib = strtoull(target, &end, 10);
		if (end == target || *end || *target == '-' || mib > (1ULL << 20)) {
			fprintf(stderr, "cove balloon: --target: '%s' is not a size in MiB\n",
				target);
			return 2;
		}
		char body[64];
		snprintf(body, sizeof(body), "{\"amount_mib\":%llu}", mib);
		if (call(sock, "PATCH", "/balloon", body))
			return 1;
	}
	return call(sock, "GET", stats ? "/balloon/statistics" : "/balloon", NULL);
}
