/* `cove version`: the version and the libraries cove was built against. */
#include <http_parser.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

#ifndef COVE_VERSION
#define COVE_VERSION "unknown"
#endif

int cmd_version(int argc, char **argv)
{
	if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
		printf("usage: cove version [--json]\nPrint the cove version and library "
		       "versions.\n");
		return 0;
	}
	if (argc > 1) {
		fprintf(stderr, "cove version: unexpected argument '%s'\n", argv[1]);
		return 2;
	}
	unsigned long hp = http_parser_version();

	printf("cove %s (http-parser %lu.%lu.%lu, jansson %s)\n", COVE_VERSION, hp >> 16 & 255,
	       hp >> 8 & 255, hp & 255, JANSSON_VERSION);
	return 0;
}
