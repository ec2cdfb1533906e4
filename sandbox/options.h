/* Command-line options of `cove run`: pure parsing, so it can be tested without a VM. */
#ifndef COVE_OPTIONS_H
#define COVE_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/log.h"
#include "devices/board.h"
#include "devices/disk_spec.h"
#include "sandbox/jail.h"

#define RUN_DEFAULT_MEM		(256ULL << 20)
#define RUN_DEFAULT_CONSOLE_MAX (64ULL << 20)

struct run_opts {
	const char *kernel;
	const char *initrd;
	const char *cmdline;
	const char *api_sock;
	const char *console;
	uint64_t console_max; /* bytes of guest console output kept; 0: the default */
	uint64_t mem_size;
	int vcpus;
	const char *cpu_template; /* --cpu-template NAME (vmm/cpu_template.h); NULL: none */
	bool track_dirty;
	bool no_seccomp; /* --no-seccomp: no filters (debugging; warns) */
	enum log_level log_level;
	int nr_disks;
	struct disk_opt disks[RUN_MAX_DISKS];
	uint64_t vsock_cid;	       /* 0: no vsock device */
	const char *vsock_uds;	       /* host Unix socket (Firecracker's hybrid vsock) */
	uint64_t vsock_rate;	       /* bytes/s per connection each way; 0: no limit */
	const char *snapshot_dir;      /* chain directory for snapshots, or NULL */
	uint64_t snapshot_interval_ms; /* 0: only on request */
	int snapshot_keep;	       /* 0: the default */
	uint64_t idle_stop_ms;	       /* 0: never */
	const char *snapshot_key;      /* key provider spec: encrypt snapshots; NULL: plain */
	const char
	    *snapshot_root; /* API snapshot_dir may name ROOT/NAME; NULL: only snapshot_dir */
	/* Table devices added by their own option (device_type.opt_name), in command-line order. */
	int nr_devs;
	struct device_spec devs[BOARD_MAX_VIRTIO];
	struct jail_opts jail; /* --jail DIR --uid N --gid N ...; jail.dir NULL: none */
};

/*
 * Returns 0 when options are good, 1 when --help was asked for, or -EINVAL
 * with a one-line message in `err`.
 */
int run_opts_parse(int argc, char **argv, struct run_opts *o, char *err, size_t errlen);
/* "256M", "4G", "1024K", "65536B"; a bare number is MiB (as QEMU's -m). -EINVAL or -ERANGE. */
int parse_mem_size(const char *s, uint64_t *out);
/*
 * "PATH[,ro]" or "PATH,overlay=OVL", then any of ",bw=RATE,iops=N,burst=SIZE,iops-burst=N";
 * -EINVAL with a one-line message in `err`.
 */
int parse_disk_opt(const char *s, struct disk_opt *d, char *err, size_t errlen);
/* A rate in bytes/s: "50M", "1G", "64K"; a bare number is bytes. 1..TB_MAX_TOKENS, else
 * -EINVAL or -ERANGE. */
int parse_rate(const char *s, uint64_t *out);
/* ",bw=N,burst=N,iops=N,iops-burst=N" for the limits set ("" for none), as --disk takes them
 * back: 0 or -E2BIG. */
int disk_rate_format(const struct rate_limit *rl, char *out, size_t len);
/* "60s", "500ms", "5m", "1h"; a bare number is seconds. -EINVAL or -ERANGE. */
int parse_duration_ms(const char *s, uint64_t *out);
/* Options `cove run` and `cove restore` share: 0, or -EINVAL with a message naming the option. */
/* One more --disk into disks[*nr] (at most RUN_MAX_DISKS): 0 or -EINVAL with err. */
int opt_disk(const char *arg, struct disk_opt *disks, int *nr, char *err, size_t errlen);
int opt_vsock_cid(const char *arg, uint64_t *out, char *err, size_t errlen);
int opt_vsock_uds(const char *arg, char *err, size_t errlen);
int opt_vsock_rate(const char *arg, uint64_t *out, char *err, size_t errlen);
int opt_snapshot_dir(const char *arg, char *err, size_t errlen);
int opt_snapshot_root(const char *arg, char *err, size_t errlen);
int opt_console_max(const char *arg, uint64_t *out, char *err, size_t errlen);
int opt_snapshot_interval(const char *arg, uint64_t *ms, char *err, size_t errlen);
int opt_snapshot_keep(const char *arg, int *keep, char *err, size_t errlen);
int opt_idle_stop(const char *arg, uint64_t *ms, char *err, size_t errlen);
/* A CPU template cove ships (vmm/cpu_template.h): 0, or -EINVAL naming the ones it has. */
int opt_cpu_template(const char *arg, char *err, size_t errlen);
int opt_key_spec(const char *opt, const char *arg, char *err, size_t errlen);
int opt_log_level(const char *arg, enum log_level *level, char *err, size_t errlen);
/* The jail's options, shared by `cove run` and `cove restore`: codes, getopt entries, help. */
enum {
	OPT_JAIL_DIR = 900,
	OPT_JAIL_UID,
	OPT_JAIL_GID,
	OPT_JAIL_MEM,
	OPT_JAIL_CPU,
	OPT_JAIL_PIDS,
	OPT_JAIL_FSIZE,
	OPT_JAIL_NOFILE,
	OPT_JAIL_KEEP,
	OPT_JAIL_HIDE,
};
#define JAIL_LONG_OPTS                                                                             \
	{"jail", required_argument, NULL, OPT_JAIL_DIR},                                           \
	    {"uid", required_argument, NULL, OPT_JAIL_UID},                                        \
	    {"gid", required_argument, NULL, OPT_JAIL_GID},                                        \
	    {"jail-mem-max", required_argument, NULL, OPT_JAIL_MEM},                               \
	    {"jail-cpu-max", required_argument, NULL, OPT_JAIL_CPU},                               \
	    {"jail-pids-max", required_argument, NULL, OPT_JAIL_PIDS},                             \
	    {"jail-fsize", required_argument, NULL, OPT_JAIL_FSIZE},                               \
	    {"jail-keep-fd", required_argument, NULL, OPT_JAIL_KEEP},                              \
	    {"jail-hide", required_argument, NULL, OPT_JAIL_HIDE},                                 \
	{                                                                                          \
		"jail-nofile", required_argument, NULL, OPT_JAIL_NOFILE                            \
	}
extern const char jail_usage[];
/* uid/gid unset, no jail. */
void jail_opts_init(struct jail_opts *j);
/* 1 when `code` is a jail option (taken into `j`), 0 when not, -EINVAL with err. */
int opt_jail(int code, const char *arg, struct jail_opts *j, char *err, size_t errlen);
/* Prints `cove run --help`, device options included. */
void run_usage_print(FILE *f);

#endif
