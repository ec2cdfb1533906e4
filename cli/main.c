/* cove: a thin dispatcher from the first argument to one subcommand. */
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>

#include "sandbox/agent_client.h" /* cmd_exec, cmd_attach, cmd_cp, cmd_forward, cmd_ps */
#include "cli/commands.h"
#include "cli/json_mode.h"

struct command {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *help;
};

static const struct command commands[] = {
    {"create", cmd_create,
     "create a named sandbox that lives across stops and restarts, and start it"},
    {"ls", cmd_ls, "list the named sandboxes with their state and sizes"},
    {"metrics", cmd_metrics, "this host's sandboxes in Prometheus text format"},
    {"template", cmd_template,
     "make (create), list (ls) or remove (rm) templates that cove create --from clones"},
    {"start", cmd_start, "start a stopped sandbox (restored from its newest snapshot)"},
    {"stop", cmd_stop, "snapshot a sandbox and end its process (RAM freed)"},
    {"up", cmd_up, "run a sandbox in the foreground until SIGTERM (for schedulers)"},
    {"archive", cmd_archive,
     "stop a sandbox and pack its chain and disks (zstd); reconnect unpacks"},
    {"pause", cmd_pause, "pause a named sandbox's vCPUs"},
    {"resume", cmd_resume, "resume a paused (or start a stopped) sandbox"},
    {"rm", cmd_rm, "delete a named sandbox and its files (leaves a tombstone)"},
    {"gc", cmd_gc,
     "archive and delete sandboxes past their --archive-after/--delete-after; bound the cache"},
    {"run", NULL, "boot a microVM and run it until the guest stops"},
    {"snapshot", cmd_snapshot, "snapshot a running sandbox (full or incremental)"},
    {"balloon", cmd_balloon,
     "show a sandbox's balloon (memory given back, stats) or set its target"},
    {"restore", NULL, "start a sandbox from a snapshot chain (memory mapped lazily)"},
    {"fork", cmd_fork, "clone a named sandbox (NAME NEW...) or a running VM (API_SOCK -n N)"},
    {"doctor", cmd_doctor, "check /dev/kvm and whether Linux guests run natively here"},
    {"rekey", cmd_rekey, "rewrap a snapshot chain's data key under a new key-encryption key"},
    {"exec", cmd_exec, "run a command in a sandbox (cove-init agent over vsock)"},
    {"attach", cmd_attach, "reconnect to a running exec session"},
    {"cp", cmd_cp, "copy a file into or out of a sandbox (SANDBOX:/path)"},
    {"forward", cmd_forward, "forward 127.0.0.1:HOSTPORT to a TCP port in a sandbox"},
    {"ps", cmd_ps, "list registered sandboxes, or one sandbox's exec sessions"},
    {"image", cmd_image, "OCI images: import (an OCI layout or archive, a docker-archive), ls, rm"},
    {"store", cmd_store, "object store commands: probe (does it honour create-only writes)"},
    {"version", cmd_version, "print the cove version"},
};

#define NR_COMMANDS (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *out)
{
	fprintf(out, "usage: cove COMMAND [options]   (cove COMMAND --help for details)\n\n");
	for (size_t i = 0; i < NR_COMMANDS; i++)
		fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv)
{
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* no core dump of guest RAM, no same-uid ptrace */
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
	    strcmp(argv[1], "help") == 0) {
		usage(stdout);
		return 0;
	}
	if (strcmp(argv[1], "--version") == 0)
		return cmd_version(1, argv + 1);
	for (size_t i = 0; i < NR_COMMANDS; i++) {
		if (strcmp(argv[1], commands[i].name) != 0)
			continue;
		/* NULL: a VMM command, run by cove-vmm in this same process. */
		if (!commands[i].fn)
			return cmd_vmm(argv[0], argc - 1, argv + 1);
		/* --json for a command whose own output is text (json_mode.h). */
		if (json_mode_wanted(argc - 1, argv + 1))
			return json_mode_run(commands[i].fn, argc - 1, argv + 1);
		return commands[i].fn(argc - 1, argv + 1);
	}
	fprintf(stderr, "cove: unknown command '%s' (try 'cove --help')\n", argv[1]);
	return 2;
}
