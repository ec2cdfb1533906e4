/* `cove version`: the version and the libraries cove was built against. */
#include <jansson.h>
#include <microhttpd.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

#ifndef COVE_VERSION
#define COVE_VERSION "unknown"
#endif

int cmd_version(int argc, char **argv)
{
	if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
		printf("usage: cove version\nPrint the cove version and library versions.\n");
		return 0;
	}
	if (argc > 1) {
		fprintf(stderr, "cove version: unexpected argument '%s'\n", argv[1]);
		return 2;
	}
	printf("cove %s (libmicrohttpd %s, jansson %s)\n", COVE_VERSION, MHD_get_version(),
	       JANSSON_VERSION);
	return 0;
}
