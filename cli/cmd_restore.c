/* `cove restore DIR`: its options; the engine is sandbox/restore_sandbox.c + snapshot/restore.c. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "common/clock.h"
#include "common/errmsg.h"
#include "sandbox/jail_paths.h"
#include "sandbox/options.h"
#include "sandbox/restore_sandbox.h"

static const char restore_usage[] =
    "usage: cove restore DIR [options]\n"
    "Start a sandbox from the snapshot chain in DIR (the latest layer unless --layer).\n"
    "Memory is mapped from the layer files and read only when the guest touches it.\n"
    "\n"
    "  --layer ID          restore this layer instead of the latest\n"
    "  --digests-checked   the caller has just checked every file's SHA-256 against the chain\n"
    "                      (the lifecycle, outside the jail): the restore does not read them "
    "again\n"
    "  --api-sock PATH     serve the control API on this Unix socket\n"
    "  --console FILE      serial console to FILE instead of stdout\n"
    "  --console-max SIZE  as for cove run (default 64M)\n"
    "  --disk PATH[,ro]    the host file for each disk the snapshot has, in order (as in cove\n"
    "                      run; size and ro must match the saved disk). For a disk that was\n"
    "                      under an overlay give its base; its frozen layers are in DIR and\n"
    "                      its new top goes into the snapshot directory\n"
    "  --vsock-uds PATH    host side of vsock: required when the snapshot has a vsock device\n"
    "  --vsock-cid N       the guest's new context id (the guest re-reads it)\n"
    "  --vsock-rate RATE   bytes/s per vsock connection, each way (as for cove run; limits\n"
    "                      come from this command line, never from the chain, and a disk's\n"
    "                      bw=,iops=,burst=,iops-burst= go on its --disk)\n"
    "  --snapshot-dir DIR2 where this sandbox's snapshots go (default: DIR when restoring the\n"
    "                      latest layer, continuing its chain incrementally)\n"
    "  --snapshot-interval T, --snapshot-keep N, --snapshot-root DIR   as for cove run\n"
    "  --idle-stop T       as for cove run (the chain is DIR or --snapshot-dir)\n"
    "  --key SPEC          key provider of an encrypted chain (required for one: it must be\n"
    "                      the provider DIR/keys records; PKCS#11 PINs come from\n"
    "                      COVE_PKCS11_PIN or pin-file=)\n"
    "  --verify            encrypted chain: authenticate every stored page and sealed disk\n"
    "                      chunk before the guest runs (otherwise each page is checked when\n"
    "                      first touched, and a bad one stops the VM; a bad disk chunk is an\n"
    "                      I/O error to the guest)\n"
    "  --no-seccomp        run without the per-thread seccomp filters (debugging only; warns)\n"
    "  --ready-fd N        write \"ok\\n\" (or a one-line error) to fd N once the vCPUs run\n"
    "  --lazy-fd N         the memory layers may still be arriving from the store: read each\n"
    "                      range only once the host's fetcher on socket N has it (cove-store)\n"
    "  --exe-fd N          the cove binary is open as fd N (clones in a jail, which has no\n"
    "                      /proc, start their own clones from it; the spawner passes it)\n"
    "  --log-level LEVEL   error|warn|info|debug (default warn)\n"
    "%s"
    "\n"
    "Exit status: as cove run; 1 with one line on stderr if the snapshot cannot be used.\n";

enum {
	O_LAYER = 256,
	O_API,
	O_CONSOLE,
	O_UDS,
	O_CID,
	O_SDIR,
	O_SINT,
	O_SKEEP,
	O_READY,
	O_LAZY,
	O_EXE,
	O_LOG,
	O_KEY,
	O_VERIFY,
	O_NO_SECCOMP,
	O_DISK,
	O_SROOT,
	O_CMAX,
	O_IDLE,
	O_VRATE,
	O_DIGESTS_CHECKED
};

static const struct option long_opts[] = {
    {"layer", required_argument, NULL, O_LAYER},
    {"digests-checked", no_argument, NULL, O_DIGESTS_CHECKED},
    {"api-sock", required_argument, NULL, O_API},
    {"console", required_argument, NULL, O_CONSOLE},
    {"vsock-uds", required_argument, NULL, O_UDS},
    {"vsock-cid", required_argument, NULL, O_CID},
    {"snapshot-dir", required_argument, NULL, O_SDIR},
    {"snapshot-interval", required_argument, NULL, O_SINT},
    {"snapshot-keep", required_argument, NULL, O_SKEEP},
    {"ready-fd", required_argument, NULL, O_READY},
    {"lazy-fd", required_argument, NULL, O_LAZY},
    {"exe-fd", required_argument, NULL, O_EXE},
    {"log-level", required_argument, NULL, O_LOG},
    {"key", required_argument, NULL, O_KEY},
    {"verify", no_argument, NULL, O_VERIFY},
    {"no-seccomp", no_argument, NULL, O_NO_SECCOMP},
    {"disk", required_argument, NULL, O_DISK},
    {"snapshot-root", required_argument, NULL, O_SROOT},
    {"console-max", required_argument, NULL, O_CMAX},
    {"idle-stop", required_argument, NULL, O_IDLE},
    {"vsock-rate", required_argument, NULL, O_VRATE},
    JAIL_LONG_OPTS,
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || *end || *s == '-' || v < lo || v > hi)
		return -EINVAL;
	*out = v;
	return 0;
}

static int parse_opts(int argc, char **argv, struct sandbox_restore_opts *o, char *err,
		      size_t errlen)
{
	memset(o, 0, sizeof(*o));
	o->ready_fd = -1;
	o->lazy_fd = -1;
	o->level = LOG_WARN;
	jail_opts_init(&o->jail);
	optind = 0;
	opterr = 0;
	uint64_t v;
	for (;;) {
		int c = getopt_long(argc, argv, ":h", long_opts, NULL);
		if (c == -1)
			break;
		switch (c) {
		case 'h':
			return 1;
		case O_DIGESTS_CHECKED:
			o->digests_checked = true;
			break;
		case O_LAYER:
			if (parse_u64(optarg, 1, UINT64_MAX, &o->layer))
				return errmsg(err, errlen, -EINVAL,
					      "--layer: '%s' is not a layer id", optarg);
			break;
		case O_API:
			o->api_sock = optarg;
			break;
		case O_CONSOLE:
			o->console = optarg;
			break;
		case O_UDS:
			if (opt_vsock_uds(optarg, err, errlen))
				return -EINVAL;
			o->vsock_uds = optarg;
			break;
		case O_CID:
			if (opt_vsock_cid(optarg, &o->vsock_cid, err, errlen))
				return -EINVAL;
			break;
		case O_VRATE:
			if (opt_vsock_rate(optarg, &o->vsock_rate, err, errlen))
				return -EINVAL;
			break;
		case O_SDIR:
			if (opt_snapshot_dir(optarg, err, errlen))
				return -EINVAL;
			o->snap_dir = optarg;
			break;
		case O_CMAX:
			if (opt_console_max(optarg, &o->console_max, err, errlen))
				return -EINVAL;
			break;
		case O_SROOT:
			if (opt_snapshot_root(optarg, err, errlen))
				return -EINVAL;
			o->snap_root = optarg;
			break;
		case O_SINT:
			if (opt_snapshot_interval(optarg, &o->interval_ms, err, errlen))
				return -EINVAL;
			break;
		case O_IDLE:
			if (opt_idle_stop(optarg, &o->idle_stop_ms, err, errlen))
				return -EINVAL;
			break;
		case O_SKEEP:
			if (opt_snapshot_keep(optarg, &o->keep, err, errlen))
				return -EINVAL;
			break;
		case O_READY:
			if (parse_u64(optarg, 3, 1 << 20, &v))
				return errmsg(err, errlen, -EINVAL,
					      "--ready-fd: '%s' is not a file descriptor", optarg);
			o->ready_fd = (int)v;
			break;
		case O_LAZY:
			if (parse_u64(optarg, 3, 1 << 20, &v) || fcntl((int)v, F_GETFD) < 0)
				return errmsg(err, errlen, -EINVAL,
					      "--lazy-fd: '%s' is not an open file descriptor",
					      optarg);
			o->lazy_fd = (int)v;
			break;
		case O_EXE:
			/* A clone in a jail (no /proc there): the binary, for its own clones. */
			if (parse_u64(optarg, 3, 1 << 20, &v) || fcntl((int)v, F_GETFD) < 0)
				return errmsg(err, errlen, -EINVAL,
					      "--exe-fd: '%s' is not an open file descriptor",
					      optarg);
			o->jail.exe_fd = (int)v;
			break;
		case O_LOG:
			if (opt_log_level(optarg, &o->level, err, errlen))
				return -EINVAL;
			break;
		case O_KEY:
			if (opt_key_spec("--key", optarg, err, errlen))
				return -EINVAL;
			o->key = optarg;
			break;
		case O_VERIFY:
			o->verify = true;
			break;
		case O_NO_SECCOMP:
			o->no_seccomp = true;
			break;
		case O_DISK:
			if (opt_disk(optarg, o->disks, &o->nr_disks, err, errlen))
				return -EINVAL;
			break;
		case ':':
			return errmsg(err, errlen, -EINVAL, "option '%s' needs a value",
				      argv[optind - 1]);
		default: {
			int taken = opt_jail(c, optarg, &o->jail, err, errlen);
			if (taken < 0)
				return taken;
			if (taken)
				break;
			return errmsg(err, errlen, -EINVAL, "unknown option '%s'",
				      argv[optind - 1]);
		}
		}
	}
	if (optind != argc - 1)
		return errmsg(err, errlen, -EINVAL,
			      optind >= argc ? "the chain directory DIR is required"
					     : "unexpected argument '%s'",
			      optind < argc ? argv[optind + 1] : "");
	o->dir = argv[optind];
	/*
	 * A test hook, deliberately not in --help: with COVE_TEST_PHASE_DIR set, restore stops at
	 * each named phase until the test lets it go (sandbox/phase_hook.h, README "Tests").
	 * Lifecycle reconnects start `cove restore` with the caller's environment, so it reaches
	 * `cove exec NAME` too.
	 */
	const char *pd = getenv("COVE_TEST_PHASE_DIR");
	o->phase_dir = pd && *pd ? pd : NULL;
	if (o->vsock_cid && !o->vsock_uds)
		return errmsg(err, errlen, -EINVAL,
			      "--vsock-cid needs --vsock-uds (a clone's own socket)");
	if (jail_opts_check(&o->jail, err, errlen))
		return -EINVAL;
	return 0;
}

int cmd_restore(int argc, char **argv)
{
	struct sandbox_restore_opts o;
	char err[512];
	int r = parse_opts(argc, argv, &o, err, sizeof(err));
	if (r == 1) {
		printf(restore_usage, jail_usage);
		return 0;
	}
	if (r) {
		fprintf(stderr, "cove restore: %s (try 'cove restore --help')\n", err);
		return 2;
	}
	struct sandbox_restore *p = calloc(1, sizeof(*p));
	if (!p) {
		fprintf(stderr, "cove restore: out of memory\n");
		return 1;
	}
	int status = 1;
	uint64_t t0 = mono_us();
	struct logger jlog = {.level = o.level, .out = stderr};
	r = jail_restore_opts(&o, &jlog, err, sizeof(err));
	if (!r)
		r = sandbox_restore_open(p, &o, err, sizeof(err));
	if (!r)
		r = sandbox_restore_validate(p, &o, err, sizeof(err));
	o.checked_us = mono_us() - t0;
	if (r) {
		fprintf(stderr, "cove restore: %s\n", err);
		if (o.ready_fd >= 0)
			dprintf(o.ready_fd, "%s\n", err);
	} else {
		status = sandbox_restore_run(p, &o);
	}
	sandbox_restore_close(p);
	free(p);
	return status;
}
