/* Helpers beside cove (cli/exec_beside.h): their libraries (libcurl, libarchive) stay out of
 * the static cove. */
#include "cli/exec_beside.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int exec_beside(const char *helper, const char *what, char **argv)
{
	char self[4096], path[4200];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n < 0) {
		fprintf(stderr, "cove %s: cannot find this executable: %s\n", what, strerror(errno));
		return 1;
	}
	self[n] = '\0';
	char *slash = strrchr(self, '/');
	if (slash)
		*slash = '\0';
	snprintf(path, sizeof(path), "%s/%s", slash ? self : ".", helper);
	argv[0] = path;
	execv(path, argv);
	fprintf(stderr, "cove %s: cannot run %s: %s\n", what, path, strerror(errno));
	return 1;
}
