/* `cove run` and `cove restore`: exec cove-vmm in place (same pid, same fds, same command line). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "lifecycle/launch.h"

/*
 * argv is the subcommand's: argv[0] is "run" or "restore". cove-vmm gets cove's own argv[0]
 * back in front, so ps and /proc/PID/cmdline show the command line the caller typed.
 */
int cmd_vmm(const char *argv0, int argc, char **argv)
{
	char exe[4096];
	char **nargv = calloc((size_t)argc + 2, sizeof(*nargv));
	int r;

	if (!nargv) {
		fprintf(stderr, "cove %s: out of memory\n", argv[0]);
		return 1;
	}
	nargv[0] = (char *)argv0;
	memcpy(nargv + 1, argv, (size_t)argc * sizeof(*nargv));
	r = sbx_vmm_exe(exe, sizeof(exe));
	if (r == 0) {
		execv(exe, nargv);
		r = -errno;
	}
	fprintf(stderr, "cove %s: cannot run the VMM %s: %s\n", argv[0],
		r == -ENAMETOOLONG ? SBX_VMM_EXE : exe, strerror(-r));
	free(nargv);
	return 1;
}
