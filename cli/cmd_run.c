/* `cove run`: build the VM from options, load the kernel, then serve the sandbox until it stops. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmm/boot.h"
#include "cli/commands.h"
#include "sandbox/jail_paths.h"
#include "sandbox/options.h"
#include "sandbox/sandbox.h"

static int boot_and_serve(struct sandbox *sb, const struct run_opts *o)
{
	/* Heap: with room for disk overlay chains a machine config is about half a MiB. */
	struct machine_config *mc = calloc(1, sizeof(*mc));
	if (!mc)
		return 1;
	mc->mem_size = o->mem_size;
	mc->vcpus = o->vcpus;
	if (o->cpu_template)
		snprintf(mc->cpu_template, sizeof(mc->cpu_template), "%s", o->cpu_template);
	mc->nr_disks = o->nr_disks;
	mc->vsock_cid = o->vsock_cid;
	mc->vsock_rate = o->vsock_rate;
	memcpy(mc->disks, o->disks, sizeof(mc->disks));
	if (o->vsock_uds)
		snprintf(mc->vsock_uds, sizeof(mc->vsock_uds), "%s", o->vsock_uds);
	mc->nr_devs = o->nr_devs;
	memcpy(mc->devs, o->devs, sizeof(mc->devs));
	/* Before the build: with an API socket it forks the clone spawner, which needs both. */
	sb->api_sock = o->api_sock;
	sb->snap_key = o->snapshot_key;
	sb->exe_fd = o->jail.exe_fd;
	sb->key_relay_fd = o->jail.key_relay_fd;
	int r = sandbox_build(sb, mc, o->track_dirty, -1, 0);
	free(mc);
	if (r)
		return 1;
	/* The guest finds virtio-mmio devices only through virtio_mmio.device= words. */
	char cmdline[4096];
	if (board_cmdline(&sb->board, o->cmdline, cmdline, sizeof(cmdline))) {
		log_err(&sb->log,
			"kernel command line with the virtio devices is longer than 4095 bytes");
		return 1;
	}
	struct boot_spec spec = {.kernel = o->kernel, .initrd = o->initrd, .cmdline = cmdline};
	if (boot_load(&sb->vm, &spec))
		return 1;
	sb->idle.limit_ms = o->idle_stop_ms;
	sb->snap_root = o->snapshot_root;
	if (o->snapshot_dir &&
	    sandbox_snapshots(sb, o->snapshot_dir, o->snapshot_interval_ms, o->snapshot_keep))
		return 1;
	return sandbox_serve(sb, o->api_sock);
}

int cmd_run(int argc, char **argv)
{
	struct run_opts o;
	char err[256];
	int r = run_opts_parse(argc, argv, &o, err, sizeof(err));
	if (r == 1) {
		run_usage_print(stdout);
		return 0;
	}
	if (r) {
		fprintf(stderr, "cove run: %s (try 'cove run --help')\n", err);
		return 2;
	}
	struct logger jlog = {.level = o.log_level, .out = stderr};
	if (jail_run_opts(&o, &jlog, err, sizeof(err))) {
		fprintf(stderr, "cove run: %s\n", err);
		return 1;
	}
	struct sandbox *sb = calloc(1, sizeof(*sb));
	if (!sb) {
		fprintf(stderr, "cove run: out of memory\n");
		return 1;
	}
	int status = 1;
	if (sandbox_init(sb, o.console, o.console_max, o.log_level) == 0) {
		sb->no_seccomp = o.no_seccomp;
		status = boot_and_serve(sb, &o);
	}
	sandbox_destroy(sb);
	free(sb);
	return status;
}
