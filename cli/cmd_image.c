/* cove image ...: execs cove-image from this executable's directory (the importer links
 * libarchive; cove itself stays a small static binary without it). */
#include "cli/commands.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int cmd_image(int argc, char **argv)
{
	char self[4096], path[4200];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n < 0) {
		fprintf(stderr, "cove image: cannot find this executable: %s\n", strerror(errno));
		return 1;
	}
	self[n] = '\0';
	char *slash = strrchr(self, '/');
	if (slash)
		*slash = '\0';
	snprintf(path, sizeof(path), "%s/cove-image", slash ? self : ".");
	(void)argc;
	argv[0] = path;
	execv(path, argv);
	fprintf(stderr, "cove image: cannot run %s: %s\n", path, strerror(errno));
	return 1;
}
