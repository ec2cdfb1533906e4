/* A sandbox's spec: the host configuration `cove create` wrote (trusted; never from a chain). */
#ifndef COVE_LIFECYCLE_SPEC_H
#define COVE_LIFECYCLE_SPEC_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/rate_limiter.h"

#define SBX_SPEC	"spec.json"
#define SBX_SPEC_MAX	(64 * 1024)
#define SBX_MAX_DISKS	8
#define SBX_CMDLINE_MAX 2048
#define SBX_KEY_MAX	1024

struct sbx_disk {
	char path[PATH_MAX]; /* the host file (a base when overlay) */
	bool read_only;
	bool overlay;		/* copy-on-write: the sandbox's writes go to a file of its own */
	struct rate_limit rate; /* --disk bw=,iops=,burst=,iops-burst=; all 0: none */
};

struct sbx_spec {
	char kernel[PATH_MAX];
	char initrd[PATH_MAX]; /* "" when the root is a disk */
	char cmdline[SBX_CMDLINE_MAX];
	uint64_t mem_bytes;
	int vcpus;
	int nr_disks;
	struct sbx_disk disks[SBX_MAX_DISKS];
	char key[SBX_KEY_MAX];	    /* key provider spec for an encrypted chain; "" plain */
	char policy[PATH_MAX];	    /* cove-broker policy file; "" none */
	uint64_t snapshot_every_ms; /* 0: no periodic snapshots */
	uint64_t idle_stop_ms, archive_after_ms, delete_after_ms; /* 0: never */
	int64_t created_ms;
	uint64_t vsock_rate; /* --vsock-rate bytes/s per connection each way; 0: none */
	bool no_seccomp;     /* --no-seccomp: its VMM runs without seccomp filters (debugging) */
	bool no_jail; /* --no-jail: its VMM runs unjailed (default: jailed, sandbox/jail.h) */
};

/* Writes spec.json beneath dfd (temp file, fsync, rename): 0 or -errno. */
int sbx_spec_write(int dfd, const struct sbx_spec *s);
/* Reads and checks spec.json: 0 or -errno with one line in err. */
int sbx_spec_read(int dfd, struct sbx_spec *s, char *err, size_t errlen);

#endif
