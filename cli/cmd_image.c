/* cove image ...: execs cove-image from this executable's directory (the importer links
 * libarchive; cove itself stays a small static binary without it). */
#include "cli/commands.h"
#include "cli/exec_beside.h"

int cmd_image(int argc, char **argv)
{
	(void)argc;
	return exec_beside("cove-image", "image", argv);
}
