/* Command-line options of `cove run`, parsed into a struct with one clear message per mistake. */
#include "sandbox/options.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

#include "common/errmsg.h"
#include "vmm/guest_mem.h"
#include "vmm/vm.h"

static const char run_usage[] =
    "usage: cove run --kernel FILE [options]\n"
    "Boot one microVM and run it until the guest stops.\n"
    "\n"
    "  --kernel FILE       guest kernel: ELF (entered in 64-bit mode at its entry) or flat binary\n"
    "  --initrd FILE       initial ramdisk\n"
    "  --cmdline TEXT      kernel command line (at most 4095 bytes)\n"
    "  --mem SIZE          guest RAM, e.g. 256M, 4G (bare number = MiB; default 256M)\n"
    "  --vcpus N           number of vCPUs (1..64, default 1)\n"
    "  --cpu-template NAME the guest sees only this CPU baseline (baseline-v2), so its\n"
    "                      snapshots restore on hosts whose CPUs differ beyond it\n"
    "  --api-sock PATH     serve the HTTP control API on this Unix socket\n"
    "  --disk PATH[,ro]    raw disk image as virtio-blk (/dev/vda, /dev/vdb... in order; max 8)\n"
    "  --disk BASE,overlay=OVL  BASE read-only under a copy-on-write overlay (OVL + OVL.map,\n"
    "                      created when absent)\n"
    "  --disk PATH,bw=RATE,iops=N,burst=SIZE,iops-burst=N  rate limit of that disk: bytes/s\n"
    "                      (50M = 50 MiB/s; a bare number is bytes), requests/s, one-time\n"
    "                      extra bytes and requests; a request over the limit waits\n"
    "  --vsock-rate RATE   bytes/s per vsock connection, each way (e.g. 10M); data waits\n"
    "  --vsock-cid N       add a virtio-vsock device; the guest's context id (3..2^32-1)\n"
    "  --vsock-uds PATH    its host side: connect to PATH and send 'CONNECT <port>\\n' to reach "
    "the\n"
    "                      guest; guest connections to host port P go to PATH_P\n"
    "%s"
    "  --console FILE      write the serial console to FILE instead of stdout (created 0600;\n"
    "                      never through a symbolic link)\n"
    "  --console-max SIZE  stop writing guest console output after SIZE (e.g. 1M, 100B;\n"
    "                      default 64M), with one log line\n"
    "  --track-dirty-pages log guest writes from boot (otherwise from the first full snapshot on)\n"
    "  --no-seccomp        run without the per-thread seccomp filters (debugging only; warns)\n"
    "  --snapshot-dir DIR  where snapshots go (a chain: chain.json, mem-N, state-N); with it\n"
    "                      the API's PUT /snapshot/create may omit the paths\n"
    "  --idle-stop T          after T with no API call, vsock traffic, guest CPU use or\n"
    "                         running command: snapshot into --snapshot-dir, then exit 0\n"
    "  --snapshot-interval T  take a snapshot every T (e.g. 60s, 500ms, 5m): full first, then\n"
    "                      incremental; needs --snapshot-dir\n"
    "  --snapshot-keep N   compact the chain into one full layer past N layers (default 16)\n"
    "  --snapshot-root DIR the API's snapshot_dir may name DIR/NAME (NAME a plain name); without\n"
    "                      it the API may name only --snapshot-dir\n"
    "  --snapshot-key SPEC encrypt snapshots (AES-256-GCM) under a data key wrapped by the\n"
    "                      user's key: key-cmd:COMMAND or pkcs11:token=T;object=O[;module=M]\n"
    "%s"
    "  --log-level LEVEL   error|warn|info|debug (default warn)\n"
    "  -h, --help          show this help\n"
    "\n"
    "Exit status: 0 when the guest stopped itself (reset/poweroff) or cove got SIGTERM/SIGINT,\n"
    "1 when the VM died (triple fault, halt, emulation failure), 2 for bad options.\n";

/* The decimal number `s` starts with, and where its unit suffix begins. 0 or -EINVAL. */
static int leading_number(const char *s, unsigned long long *v, char **end)
{
	errno = 0;
	*v = strtoull(s, end, 10);
	return errno || *end == s ? -EINVAL : 0;
}

int parse_mem_size(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	if (!s || !*s || *s == '-' || *s == '+' || leading_number(s, &v, &end))
		return -EINVAL;
	unsigned shift;
	switch (*end) {
	case '\0':
	case 'M':
	case 'm':
		shift = 20;
		break;
	case 'G':
	case 'g':
		shift = 30;
		break;
	case 'K':
	case 'k':
		shift = 10;
		break;
	case 'B':
	case 'b':
		shift = 0;
		break;
	default:
		return -EINVAL;
	}
	if (*end && end[1] != '\0' && !((end[1] == 'i' || end[1] == 'B') && end[2] == '\0') &&
	    !(end[1] == 'i' && end[2] == 'B' && end[3] == '\0'))
		return -EINVAL;
	if (v > (UINT64_MAX >> shift))
		return -ERANGE;
	*out = (uint64_t)v << shift;
	return 0;
}

void run_usage_print(FILE *f)
{
	/* Device options sit after the built-in devices' own. */
	char devs[2048] = "";
	size_t len = 0;
	for (int i = 0; device_types[i]; i++)
		if (device_types[i]->opt_help && len < sizeof(devs))
			len += (size_t)snprintf(devs + len, sizeof(devs) - len, "%s",
						device_types[i]->opt_help);
	fprintf(f, run_usage, devs, jail_usage);
}

enum { OPT_DEVICE = 1024 }; /* + index in device_types */

enum {
	OPT_KERNEL = 256,
	OPT_INITRD,
	OPT_CMDLINE,
	OPT_MEM,
	OPT_VCPUS,
	OPT_API,
	OPT_CONSOLE,
	OPT_LOG,
	OPT_DIRTY,
	OPT_NO_SECCOMP,
	OPT_DISK,
	OPT_VSOCK_CID,
	OPT_VSOCK_UDS,
	OPT_SNAP_DIR,
	OPT_SNAP_INTERVAL,
	OPT_SNAP_KEEP,
	OPT_SNAP_KEY,
	OPT_SNAP_ROOT,
	OPT_CONSOLE_MAX,
	OPT_IDLE_STOP,
	OPT_VSOCK_RATE,
	OPT_CPU_TEMPLATE
};

int parse_duration_ms(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	if (!s || *s < '0' || *s > '9' || leading_number(s, &v, &end))
		return -EINVAL;
	uint64_t mul;
	if (!strcmp(end, "ms"))
		mul = 1;
	else if (!strcmp(end, "s") || !*end)
		mul = 1000;
	else if (!strcmp(end, "m"))
		mul = 60000;
	else if (!strcmp(end, "h"))
		mul = 3600000;
	else if (!strcmp(end, "d"))
		mul = 86400000;
	else
		return -EINVAL;
	if (v > UINT64_MAX / mul)
		return -ERANGE;
	*out = v * mul;
	return 0;
}

int parse_rate(const char *s, uint64_t *out)
{
	size_t n = s ? strlen(s) : 0;
	int r;
	if (!n || *s < '0' || *s > '9')
		return -EINVAL;
	if (s[n - 1] >= '0' && s[n - 1] <= '9') {
		char *end;
		unsigned long long v;
		if (leading_number(s, &v, &end) || *end)
			return -EINVAL;
		*out = v;
	} else if ((r = parse_mem_size(s, out))) {
		return r;
	}
	return *out && *out <= TB_MAX_TOKENS ? 0 : -ERANGE;
}

/* One key=value of a --disk rate limit; 1 when `opt` is one, 0 when not, -EINVAL with err. */
static int disk_rate_key(const char *opt, size_t olen, const char *whole, struct rate_limit *rl,
			 char *err, size_t errlen)
{
	static const struct {
		const char *key;
		size_t off;
		bool bytes; /* a size with K/M/G, else a count */
	} keys[] = {
	    {"bw=", offsetof(struct rate_limit, bw), true},
	    {"burst=", offsetof(struct rate_limit, bw_burst), true},
	    {"iops=", offsetof(struct rate_limit, iops), false},
	    {"iops-burst=", offsetof(struct rate_limit, iops_burst), false},
	};
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		size_t kl = strlen(keys[i].key);
		if (olen < kl || strncmp(opt, keys[i].key, kl))
			continue;
		char val[32];
		uint64_t *v = (uint64_t *)((char *)rl + keys[i].off);
		int bad = olen - kl >= sizeof(val);
		if (!bad) {
			memcpy(val, opt + kl, olen - kl);
			val[olen - kl] = '\0';
			bad = keys[i].bytes
				  ? parse_rate(val, v) != 0
				  : (parse_rate(val, v) != 0 ||
				     !(val[olen - kl - 1] >= '0' && val[olen - kl - 1] <= '9') ||
				     *v > 1000000000ULL);
		}
		if (bad)
			return errmsg(
			    err, errlen, -EINVAL,
			    keys[i].bytes
				? "--disk: %.*s in '%s' is not a size from 1 to 2^50 (e.g. 50M)"
				: "--disk: %.*s in '%s' is not a number from 1 to 1000000000",
			    (int)olen, opt, whole);
		return 1;
	}
	return 0;
}

int disk_rate_format(const struct rate_limit *rl, char *out, size_t len)
{
	int n = snprintf(out, len, "%s", "");
	const struct {
		const char *key;
		uint64_t v;
	} keys[] = {{"bw", rl->bw},
		    {"burst", rl->bw_burst},
		    {"iops", rl->iops},
		    {"iops-burst", rl->iops_burst}};
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		if (!keys[i].v)
			continue;
		n += snprintf(out + n, len > (size_t)n ? len - (size_t)n : 0, ",%s=%llu",
			      keys[i].key, (unsigned long long)keys[i].v);
	}
	return (size_t)n < len ? 0 : -E2BIG;
}

int parse_disk_opt(const char *s, struct disk_opt *d, char *err, size_t errlen)
{
	memset(d, 0, sizeof(*d));
	const char *comma = strchr(s, ',');
	size_t plen = comma ? (size_t)(comma - s) : strlen(s);
	if (plen == 0)
		return errmsg(err, errlen, -EINVAL, "--disk: '%s' has no path (use PATH[,ro])", s);
	if (plen >= sizeof(d->path))
		return errmsg(err, errlen, -EINVAL, "--disk: path is longer than %d bytes",
			      RUN_DISK_PATH_MAX - 1);
	memcpy(d->path, s, plen);
	int r;
	while (comma) {
		const char *opt = comma + 1;
		comma = strchr(opt, ',');
		size_t olen = comma ? (size_t)(comma - opt) : strlen(opt);
		if (olen == 2 && !strncmp(opt, "ro", 2)) {
			d->read_only = true;
		} else if (olen >= 8 && !strncmp(opt, "overlay=", 8)) {
			if (olen == 8)
				return errmsg(err, errlen, -EINVAL,
					      "--disk: overlay= needs a path in '%s'", s);
			if (olen - 8 >= sizeof(d->overlay))
				return errmsg(err, errlen, -EINVAL,
					      "--disk: overlay path is longer than %d bytes",
					      RUN_DISK_PATH_MAX - 1);
			memcpy(d->overlay, opt + 8, olen - 8);
		} else if ((r = disk_rate_key(opt, olen, s, &d->rate, err, errlen))) {
			if (r < 0)
				return r;
		} else {
			return errmsg(
			    err, errlen, -EINVAL,
			    "--disk: unknown option '%.*s' in '%s' (use PATH[,ro|,overlay=OVL]"
			    "[,bw=RATE][,iops=N][,burst=SIZE][,iops-burst=N])",
			    (int)olen, opt, s);
		}
	}
	if (d->read_only && d->overlay[0])
		return errmsg(err, errlen, -EINVAL,
			      "--disk: ro and overlay= do not go together in '%s'", s);
	if ((d->rate.bw_burst && !d->rate.bw) || (d->rate.iops_burst && !d->rate.iops))
		return errmsg(err, errlen, -EINVAL,
			      "--disk: burst= needs bw= and iops-burst= needs iops= in '%s'", s);
	return 0;
}

/*
 * Checks of the options `cove run` and `cove restore` share; each returns 0 or -EINVAL with a
 * one-line message naming the option.
 */
/* A whole decimal number in [min, max] (no sign, no trailing text). */
static int opt_number(const char *opt, const char *arg, uint64_t min, uint64_t max, uint64_t *out,
		      char *err, size_t errlen)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(arg, &end, 10);
	if (errno || end == arg || *end || *arg == '-' || v < min || v > max)
		return errmsg(err, errlen, -EINVAL, "%s: '%s' is not a number from %llu to %llu",
			      opt, arg, (unsigned long long)min, (unsigned long long)max);
	*out = v;
	return 0;
}

static int opt_path(const char *opt, const char *arg, size_t max, char *err, size_t errlen)
{
	if (!*arg || strlen(arg) > max)
		return errmsg(err, errlen, -EINVAL, "%s: path must be 1 to %zu bytes long", opt,
			      max);
	return 0;
}

int opt_disk(const char *arg, struct disk_opt *disks, int *nr, char *err, size_t errlen)
{
	if (*nr >= RUN_MAX_DISKS)
		return errmsg(err, errlen, -EINVAL, "--disk: at most %d disks", RUN_MAX_DISKS);
	if (parse_disk_opt(arg, &disks[*nr], err, errlen))
		return -EINVAL;
	(*nr)++;
	return 0;
}

int opt_vsock_cid(const char *arg, uint64_t *out, char *err, size_t errlen)
{
	/* 0-2 are reserved, 4294967295 is VMADDR_CID_ANY. */
	return opt_number("--vsock-cid", arg, 3, UINT32_MAX - 1ULL, out, err, errlen);
}

int opt_vsock_rate(const char *arg, uint64_t *out, char *err, size_t errlen)
{
	if (parse_rate(arg, out))
		return errmsg(err, errlen, -EINVAL,
			      "--vsock-rate: '%s' is not a rate from 1 to 2^50 bytes/s (e.g. 10M)",
			      arg);
	return 0;
}

int opt_vsock_uds(const char *arg, char *err, size_t errlen)
{
	/* Room for "_<port>" in sun_path (108 bytes) for guest-initiated connections. */
	return opt_path("--vsock-uds", arg, 96, err, errlen);
}

int opt_snapshot_dir(const char *arg, char *err, size_t errlen)
{
	return opt_path("--snapshot-dir", arg, 3800, err, errlen);
}

int opt_console_max(const char *arg, uint64_t *out, char *err, size_t errlen)
{
	if (parse_mem_size(arg, out) || *out == 0 || *out > (1ULL << 40))
		return errmsg(err, errlen, -EINVAL,
			      "--console-max: '%s' is not a size from 1B to 1T (e.g. 64M, 100B)",
			      arg);
	return 0;
}

int opt_snapshot_root(const char *arg, char *err, size_t errlen)
{
	return opt_path("--snapshot-root", arg, 3500, err, errlen);
}

int opt_snapshot_interval(const char *arg, uint64_t *ms, char *err, size_t errlen)
{
	if (parse_duration_ms(arg, ms) || *ms < 10 || *ms > 86400000ULL)
		return errmsg(err, errlen, -EINVAL,
			      "--snapshot-interval: '%s' is not a duration from 10ms to 24h "
			      "(e.g. 60s, 500ms, 5m)",
			      arg);
	return 0;
}

int opt_idle_stop(const char *arg, uint64_t *ms, char *err, size_t errlen)
{
	if (parse_duration_ms(arg, ms) || *ms < 1000)
		return errmsg(err, errlen, -EINVAL,
			      "--idle-stop: '%s' is not a duration of 1s or more (e.g. 15m)", arg);
	return 0;
}

int opt_cpu_template(const char *arg, char *err, size_t errlen)
{
	if (!cpu_template_known(arg))
		return errmsg(err, errlen, -EINVAL,
			      "--cpu-template: '%.40s' is not a CPU template cove has (%s)", arg,
			      cpu_template_names());
	return 0;
}

int opt_snapshot_keep(const char *arg, int *keep, char *err, size_t errlen)
{
	uint64_t v;
	int r = opt_number("--snapshot-keep", arg, 1, 200, &v, err, errlen);
	if (!r)
		*keep = (int)v;
	return r;
}

int opt_key_spec(const char *opt, const char *arg, char *err, size_t errlen)
{
	if (strncmp(arg, "key-cmd:", 8) && strncmp(arg, "pkcs11:", 7))
		return errmsg(err, errlen, -EINVAL, "%s: '%s' is not key-cmd:COMMAND or pkcs11:...",
			      opt, arg);
	return 0;
}

const char jail_usage[] =
    "  --jail DIR          run jailed: new namespaces, DIR (absolute) becomes a root holding only\n"
    "                      this sandbox's paths (host paths are rewritten to theirs), every\n"
    "                      capability dropped; needs --uid and --gid\n"
    "  --uid N, --gid N    the ids the jailed VMM runs as\n"
    "  --jail-mem-max SIZE cgroup v2 memory.max (when a writable cgroup2 hierarchy exists)\n"
    "  --jail-cpu-max PCT  cgroup v2 cpu.max in percent of one CPU (1..6400)\n"
    "  --jail-pids-max N   cgroup v2 pids.max (default 1024)\n"
    "  --jail-fsize SIZE   RLIMIT_FSIZE (default 1T); --jail-nofile N: RLIMIT_NOFILE (4096)\n"
    "  --jail-keep-fd N    an inherited fd the jail keeps open (the lifecycle's life lock);\n"
    "                      every other fd past stderr is closed\n"
    "  --jail-hide PATH    a path inside a bound directory that the jail shows empty (a\n"
    "                      directory) or as /dev/null (a file): the broker's, beside ours\n";

void jail_opts_init(struct jail_opts *j)
{
	memset(j, 0, sizeof(*j));
	j->uid = -1;
	j->gid = -1;
	j->exe_fd = -1;
	j->key_relay_fd = -1;
}

int opt_jail(int code, const char *arg, struct jail_opts *j, char *err, size_t errlen)
{
	uint64_t v;
	switch (code) {
	case OPT_JAIL_DIR:
		if (arg[0] != '/' || strlen(arg) > 1024)
			return errmsg(err, errlen, -EINVAL,
				      "--jail: '%s' is not an absolute path of at most 1024 bytes",
				      arg);
		j->dir = arg;
		return 1;
	case OPT_JAIL_UID:
	case OPT_JAIL_GID:
		if (opt_number(code == OPT_JAIL_UID ? "--uid" : "--gid", arg, 0, UINT32_MAX - 1ULL,
			       &v, err, errlen))
			return -EINVAL;
		*(code == OPT_JAIL_UID ? &j->uid : &j->gid) = (int64_t)v;
		return 1;
	case OPT_JAIL_MEM:
	case OPT_JAIL_FSIZE:
		if (parse_mem_size(arg, &v) || v < (1ULL << 20) || v > (1ULL << 50))
			return errmsg(err, errlen, -EINVAL, "%s: '%s' is not a size from 1M to 1P",
				      code == OPT_JAIL_MEM ? "--jail-mem-max" : "--jail-fsize",
				      arg);
		*(code == OPT_JAIL_MEM ? &j->mem_max : &j->fsize_max) = v;
		return 1;
	case OPT_JAIL_CPU:
		return opt_number("--jail-cpu-max", arg, 1, 6400, &j->cpu_max_pct, err, errlen)
			   ? -EINVAL
			   : 1;
	case OPT_JAIL_PIDS:
		return opt_number("--jail-pids-max", arg, 16, 1 << 22, &j->pids_max, err, errlen)
			   ? -EINVAL
			   : 1;
	case OPT_JAIL_NOFILE:
		return opt_number("--jail-nofile", arg, 64, 1 << 20, &j->nofile, err, errlen)
			   ? -EINVAL
			   : 1;
	case OPT_JAIL_KEEP:
		if (opt_number("--jail-keep-fd", arg, 3, 1023, &v, err, errlen))
			return -EINVAL;
		if (fcntl((int)v, F_GETFD) < 0)
			return errmsg(err, errlen, -EINVAL, "--jail-keep-fd: %s is not an open fd",
				      arg);
		if (j->nr_keep >= (int)(sizeof(j->keep) / sizeof(j->keep[0])))
			return errmsg(err, errlen, -EINVAL, "--jail-keep-fd: at most %zu",
				      sizeof(j->keep) / sizeof(j->keep[0]));
		j->keep[j->nr_keep++] = (int)v;
		return 1;
	case OPT_JAIL_HIDE:
		if (arg[0] != '/' || strlen(arg) > 1024)
			return errmsg(err, errlen, -EINVAL,
				      "--jail-hide: '%s' is not an absolute path of at most 1024 "
				      "bytes",
				      arg);
		if (j->nr_hide >= JAIL_MAX_HIDE)
			return errmsg(err, errlen, -EINVAL, "--jail-hide: at most %d",
				      JAIL_MAX_HIDE);
		j->hide[j->nr_hide++] = arg;
		return 1;
	}
	return 0;
}

int opt_log_level(const char *arg, enum log_level *level, char *err, size_t errlen)
{
	if (log_level_parse(arg, level))
		return errmsg(err, errlen, -EINVAL,
			      "--log-level: '%s' is not one of error, warn, info, debug", arg);
	return 0;
}

static const struct option run_builtin_opts[] = {
    {"kernel", required_argument, NULL, OPT_KERNEL},
    {"initrd", required_argument, NULL, OPT_INITRD},
    {"cmdline", required_argument, NULL, OPT_CMDLINE},
    {"mem", required_argument, NULL, OPT_MEM},
    {"vcpus", required_argument, NULL, OPT_VCPUS},
    {"cpu-template", required_argument, NULL, OPT_CPU_TEMPLATE},
    {"api-sock", required_argument, NULL, OPT_API},
    {"console", required_argument, NULL, OPT_CONSOLE},
    {"console-max", required_argument, NULL, OPT_CONSOLE_MAX},
    {"idle-stop", required_argument, NULL, OPT_IDLE_STOP},
    {"log-level", required_argument, NULL, OPT_LOG},
    {"track-dirty-pages", no_argument, NULL, OPT_DIRTY},
    {"no-seccomp", no_argument, NULL, OPT_NO_SECCOMP},
    {"disk", required_argument, NULL, OPT_DISK},
    {"vsock-cid", required_argument, NULL, OPT_VSOCK_CID},
    {"vsock-uds", required_argument, NULL, OPT_VSOCK_UDS},
    {"vsock-rate", required_argument, NULL, OPT_VSOCK_RATE},
    {"snapshot-dir", required_argument, NULL, OPT_SNAP_DIR},
    {"snapshot-interval", required_argument, NULL, OPT_SNAP_INTERVAL},
    {"snapshot-keep", required_argument, NULL, OPT_SNAP_KEEP},
    {"snapshot-key", required_argument, NULL, OPT_SNAP_KEY},
    {"snapshot-root", required_argument, NULL, OPT_SNAP_ROOT},
    JAIL_LONG_OPTS,
    {"help", no_argument, NULL, 'h'},
};

#define NR_BUILTIN	 (sizeof(run_builtin_opts) / sizeof(run_builtin_opts[0]))
#define MAX_DEVICE_TYPES 32

/* The built-in options, then one per device type that has one (--OPT or --OPT=ARG). */
static void run_long_opts(struct option *out)
{
	size_t n = NR_BUILTIN;
	memcpy(out, run_builtin_opts, sizeof(run_builtin_opts));
	for (int i = 0; device_types[i] && i < MAX_DEVICE_TYPES; i++)
		if (device_types[i]->opt_name)
			out[n++] = (struct option){device_types[i]->opt_name, optional_argument,
						   NULL, OPT_DEVICE + i};
	out[n] = (struct option){NULL, 0, NULL, 0};
}

static int check_snapshot_key(const char *arg, char *err, size_t errlen)
{
	return opt_key_spec("--snapshot-key", arg, err, errlen);
}

/* Options kept as given (after their check, if any) and options that parse into a number. */
static const struct {
	int code;
	size_t off; /* of the const char * in struct run_opts */
	int (*check)(const char *arg, char *err, size_t errlen);
} string_opts[] = {
    {OPT_KERNEL, offsetof(struct run_opts, kernel), NULL},
    {OPT_INITRD, offsetof(struct run_opts, initrd), NULL},
    {OPT_CMDLINE, offsetof(struct run_opts, cmdline), NULL},
    {OPT_API, offsetof(struct run_opts, api_sock), NULL},
    {OPT_CONSOLE, offsetof(struct run_opts, console), NULL},
    {OPT_VSOCK_UDS, offsetof(struct run_opts, vsock_uds), opt_vsock_uds},
    {OPT_SNAP_DIR, offsetof(struct run_opts, snapshot_dir), opt_snapshot_dir},
    {OPT_SNAP_KEY, offsetof(struct run_opts, snapshot_key), check_snapshot_key},
    {OPT_SNAP_ROOT, offsetof(struct run_opts, snapshot_root), opt_snapshot_root},
    {OPT_CPU_TEMPLATE, offsetof(struct run_opts, cpu_template), opt_cpu_template},
};
static const struct {
	int code;
	size_t off; /* of the uint64_t in struct run_opts */
	int (*parse)(const char *arg, uint64_t *out, char *err, size_t errlen);
} number_opts[] = {
    {OPT_CONSOLE_MAX, offsetof(struct run_opts, console_max), opt_console_max},
    {OPT_VSOCK_CID, offsetof(struct run_opts, vsock_cid), opt_vsock_cid},
    {OPT_VSOCK_RATE, offsetof(struct run_opts, vsock_rate), opt_vsock_rate},
    {OPT_SNAP_INTERVAL, offsetof(struct run_opts, snapshot_interval_ms), opt_snapshot_interval},
    {OPT_IDLE_STOP, offsetof(struct run_opts, idle_stop_ms), opt_idle_stop},
};

/* 1 when option `c` is one of the tables' (taken), 0 when not, -EINVAL on a bad value. */
static int parse_table_opt(int c, const char *arg, struct run_opts *o, char *err, size_t errlen)
{
	for (size_t i = 0; i < sizeof(string_opts) / sizeof(string_opts[0]); i++) {
		if (string_opts[i].code != c)
			continue;
		if (string_opts[i].check && string_opts[i].check(arg, err, errlen))
			return -EINVAL;
		*(const char **)((char *)o + string_opts[i].off) = arg;
		return 1;
	}
	for (size_t i = 0; i < sizeof(number_opts) / sizeof(number_opts[0]); i++)
		if (number_opts[i].code == c)
			return number_opts[i].parse(
				   arg, (uint64_t *)((char *)o + number_opts[i].off), err, errlen)
				   ? -EINVAL
				   : 1;
	return 0;
}

static int parse_device_opt(int i, const char *arg, struct run_opts *o, char *err, size_t errlen)
{
	const struct device_type *t = device_types[i];
	if (o->nr_devs >= BOARD_MAX_VIRTIO)
		return errmsg(err, errlen, -EINVAL, "--%s: at most %d virtio devices", t->opt_name,
			      BOARD_MAX_VIRTIO);
	struct device_spec *d = &o->devs[o->nr_devs];
	memset(d, 0, sizeof(*d));
	d->type = t;
	char why[200] = "";
	if (t->opt_parse(arg, d->cfg, why, sizeof(why)))
		return errmsg(err, errlen, -EINVAL, "--%s: %s", t->opt_name, why);
	o->nr_devs++;
	return 0;
}

int run_opts_parse(int argc, char **argv, struct run_opts *o, char *err, size_t errlen)
{
	memset(o, 0, sizeof(*o));
	o->mem_size = RUN_DEFAULT_MEM;
	o->vcpus = 1;
	o->log_level = LOG_WARN;
	o->cmdline = "";
	jail_opts_init(&o->jail);

	struct option long_opts[NR_BUILTIN + MAX_DEVICE_TYPES + 1];
	run_long_opts(long_opts);
	/* getopt keeps its position in globals: restart it so parsing is repeatable. */
	optind = 0;
	opterr = 0;
	for (;;) {
		int c = getopt_long(argc, argv, ":h", long_opts, NULL);
		if (c == -1)
			break;
		if (c >= OPT_DEVICE) {
			if (parse_device_opt(c - OPT_DEVICE, optarg, o, err, errlen))
				return -EINVAL;
			continue;
		}
		int taken = parse_table_opt(c, optarg, o, err, errlen);
		if (!taken)
			taken = opt_jail(c, optarg, &o->jail, err, errlen);
		if (taken < 0)
			return taken;
		if (taken)
			continue;
		switch (c) {
		case 'h':
			return 1;
		case OPT_DIRTY:
			o->track_dirty = true;
			break;
		case OPT_NO_SECCOMP:
			o->no_seccomp = true;
			break;
		case OPT_DISK:
			if (opt_disk(optarg, o->disks, &o->nr_disks, err, errlen))
				return -EINVAL;
			break;
		case OPT_MEM: {
			int r = parse_mem_size(optarg, &o->mem_size);
			if (r)
				return errmsg(err, errlen, -EINVAL,
					      "--mem: '%s' is not a size like 256M or 4G", optarg);
			if (o->mem_size < MEM_MIN_SIZE || o->mem_size > MEM_MAX_SIZE ||
			    o->mem_size % PAGE_SIZE)
				return errmsg(
				    err, errlen, -EINVAL,
				    "--mem: %s is out of range (2M..1T, a multiple of 4K)", optarg);
			break;
		}
		case OPT_VCPUS: {
			char *end;
			errno = 0;
			long v = strtol(optarg, &end, 10);
			if (errno || end == optarg || *end || v < 1 || v > VM_MAX_VCPUS)
				return errmsg(err, errlen, -EINVAL,
					      "--vcpus: '%s' is not a number from 1 to %d", optarg,
					      VM_MAX_VCPUS);
			o->vcpus = (int)v;
			break;
		}
		case OPT_SNAP_KEEP:
			if (opt_snapshot_keep(optarg, &o->snapshot_keep, err, errlen))
				return -EINVAL;
			break;
		case OPT_LOG:
			if (opt_log_level(optarg, &o->log_level, err, errlen))
				return -EINVAL;
			break;
		case ':':
			return errmsg(err, errlen, -EINVAL, "option '%s' needs a value",
				      argv[optind - 1]);
		case '?':
		default:
			return errmsg(err, errlen, -EINVAL, "unknown option '%s'",
				      argv[optind - 1]);
		}
	}
	if (optind < argc)
		return errmsg(err, errlen, -EINVAL, "unexpected argument '%s'", argv[optind]);
	if (!o->kernel)
		return errmsg(err, errlen, -EINVAL, "--kernel FILE is required");
	if (strlen(o->cmdline) >= 4096)
		return errmsg(err, errlen, -EINVAL, "--cmdline is longer than 4095 bytes");
	if (!o->vsock_cid != !o->vsock_uds)
		return errmsg(err, errlen, -EINVAL, "--vsock-cid and --vsock-uds go together");
	if (o->vsock_rate && !o->vsock_cid)
		return errmsg(err, errlen, -EINVAL,
			      "--vsock-rate needs --vsock-cid and --vsock-uds");
	if (o->snapshot_key && !o->snapshot_dir)
		return errmsg(err, errlen, -EINVAL, "--snapshot-key needs --snapshot-dir");
	if (o->snapshot_interval_ms && !o->snapshot_dir)
		return errmsg(err, errlen, -EINVAL, "--snapshot-interval needs --snapshot-dir");
	if (o->idle_stop_ms && (!o->snapshot_dir || !o->vsock_uds))
		return errmsg(err, errlen, -EINVAL, "--idle-stop needs --snapshot-dir and vsock");
	if (jail_opts_check(&o->jail, err, errlen))
		return -EINVAL;
	return 0;
}
