/* cove store ...: execs cove-store from this executable's directory (the store client links
 * libcurl and libxml2; cove itself stays a small static binary without them). */
#include "cli/commands.h"
#include "cli/exec_beside.h"

int cmd_store(int argc, char **argv)
{
	(void)argc;
	return exec_beside("cove-store", "store", argv);
}
