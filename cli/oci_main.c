/* cove-oci: an OCI runtime for podman, containerd and CRI whose containers are cove microVMs
 * (cli/oci.h). runc's command line: global flags, then a command. */
#include "cli/oci.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_USAGE 2

static void usage(FILE *out)
{
	fprintf(
	    out,
	    "usage: cove-oci [--root DIR] [--log FILE] [--log-format text|json] [--debug]\n"
	    "                COMMAND [options] ID\n"
	    "An OCI runtime: every container is a cove microVM (a sandbox named oci-<hex>),\n"
	    "its root the bundle's root directory made an ext4 (or the cove image named by the\n"
	    "annotation cove.dev/image), its process run in the guest through cove exec.\n"
	    "  create --bundle DIR --pid-file FILE [--console-socket SOCK] ID\n"
	    "                 boot the VM; the pid file names the process whose exit status\n"
	    "                 is the container's; it waits for start\n"
	    "  start ID       let the container's process run\n"
	    "  state ID       the runtime spec's state object (JSON)\n"
	    "  kill [--all] ID [SIGNAL]   KILL ends the VM; INT, TERM, HUP, QUIT, USR1, USR2\n"
	    "                 and WINCH reach the process in the guest (default TERM)\n"
	    "  delete [--force] ID        remove it (--force: running too)\n"
	    "  exec --process FILE [--detach] [--pid-file FILE] [--tty --console-socket SOCK] ID\n"
	    "  pause ID | resume ID       the VM's vCPUs\n"
	    "  ps [--format table|json] ID   its processes on the host\n"
	    "  checkpoint --image-path DIR [--leave-running] ID\n"
	    "                 a cove snapshot of the VM into DIR (no CRIU)\n"
	    "  restore --image-path DIR --bundle DIR --pid-file FILE [--detach] ID\n"
	    "                 the checkpointed VM back, its process running on\n"
	    "  --version\n"
	    "--root: its records (default " OCI_DEFAULT_ROOT "); the sandboxes live in\n"
	    "${COVE_STATE_DIR:-/var/lib/cove} as cove's own do. Annotations: cove.dev/image,\n"
	    "cove.dev/mem (e.g. 512M), cove.dev/vcpus. Exit status: 0, 1 an error (one line on\n"
	    "stderr and in --log), 2 bad usage; exec without --detach: the process's.\n");
}

static const struct {
	const char *name;
	int (*fn)(struct oci_ctx *, int, char **);
} cmds[] = {
    {"create", oci_cmd_create},	  {"start", oci_cmd_start},
    {"state", oci_cmd_state},	  {"kill", oci_cmd_kill},
    {"delete", oci_cmd_delete},	  {"exec", oci_cmd_exec},
    {"pause", oci_cmd_pause},	  {"resume", oci_cmd_pause},
    {"ps", oci_cmd_ps},		  {"checkpoint", oci_cmd_checkpoint},
    {"restore", oci_cmd_restore},
};

int main(int argc, char **argv)
{
	struct logger log = {.level = LOG_INFO, .out = stderr, .name = "cove-oci"};
	struct oci_ctx x = {.root = OCI_DEFAULT_ROOT, .log = &log};
	const char *log_path = NULL;
	int i = 1;

	/* Global flags (runc's), before the command. */
	for (; i < argc && argv[i][0] == '-'; i++) {
		const char *a = argv[i], *v = NULL;
		const char *eq = strchr(a, '=');
		char flag[64];
		snprintf(flag, sizeof(flag), "%.*s", eq ? (int)(eq - a) : 63, a);
		bool takes = !strcmp(flag, "--root") || !strcmp(flag, "--log") ||
			     !strcmp(flag, "--log-format") || !strcmp(flag, "--criu") ||
			     !strcmp(flag, "--rootless");
		if (takes) {
			v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
			if (!v) {
				fprintf(stderr, "cove-oci: %s needs a value\n", flag);
				return EXIT_USAGE;
			}
		}
		if (!strcmp(flag, "--version") || !strcmp(flag, "-v")) {
			printf("cove-oci version %s\nspec: 1.0.2\n", COVE_VERSION);
			return 0;
		} else if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(flag, "--root")) {
			x.root = v;
		} else if (!strcmp(flag, "--log")) {
			log_path = v;
		} else if (!strcmp(flag, "--log-format")) {
			if (strcmp(v, "json") && strcmp(v, "text")) {
				fprintf(stderr, "cove-oci: --log-format: json or text\n");
				return EXIT_USAGE;
			}
			log.json = !strcmp(v, "json");
		} else if (!strcmp(flag, "--debug")) {
			log.level = LOG_DEBUG;
		} else if (!strcmp(flag, "--systemd-cgroup") || takes) {
			/* no cgroups of its own: the VM is the boundary; --criu, --rootless unused
			 */
		} else {
			fprintf(stderr, "cove-oci: unknown global option '%s'\n", a);
			return EXIT_USAGE;
		}
	}
	if (i >= argc) {
		usage(stderr);
		return EXIT_USAGE;
	}
	if (log_path) {
		FILE *f = fopen(log_path, "ae");
		if (f)
			log.out = f;
		else
			fprintf(stderr, "cove-oci: --log %s: %s\n", log_path, strerror(errno));
	}
	/* Without --log, stderr is the container's own at create and exec (the engine's pipe):
	 * only errors go there, never progress lines. */
	if (log.level != LOG_DEBUG)
		log.level = log.out == stderr ? LOG_ERROR : LOG_INFO;
	for (size_t c = 0; c < sizeof(cmds) / sizeof(*cmds); c++)
		if (!strcmp(argv[i], cmds[c].name))
			return cmds[c].fn(&x, argc - i, argv + i);
	oci_fail(&x, "unknown command '%s' (cove-oci --help)", argv[i]);
	return EXIT_USAGE;
}
