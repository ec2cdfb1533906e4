/*
 * cove-vmm: the process that runs one guest (`cove run`, `cove restore`, the lifecycle launch
 * and clones exec it). It links the runtime layers only: no API client, libcurl, zstd or
 * lifecycle code, so a guest that escapes a device lands in a process mapping little.
 */
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>

#include "cli/commands.h"

int main(int argc, char **argv)
{
	/* exec resets this: no core dump of guest RAM, no same-uid ptrace. */
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	if (argc >= 2 && strcmp(argv[1], "run") == 0)
		return cmd_run(argc - 1, argv + 1);
	if (argc >= 2 && strcmp(argv[1], "restore") == 0)
		return cmd_restore(argc - 1, argv + 1);
	fprintf(stderr, "usage: cove-vmm run|restore [options]   (started by 'cove run' and "
			"'cove restore'; see 'cove run --help')\n");
	return 2;
}
