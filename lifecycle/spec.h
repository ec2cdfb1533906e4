/* A sandbox's spec: the host configuration `cove create` wrote (trusted; never from a chain). */
#ifndef COVE_LIFECYCLE_SPEC_H
#define COVE_LIFECYCLE_SPEC_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/rate_limiter.h"
#include "vmm/cpu_template.h"

#define SBX_SPEC	"spec.json"
#define SBX_SPEC_MAX	(64 * 1024)
#define SBX_MAX_DISKS	8
#define SBX_CMDLINE_MAX 2048
#define SBX_KEY_MAX	1024
#define SBX_MACHINE_ID_LEN 32 /* /etc/machine-id: 128 bits in lowercase hex */

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
	/* --cpu-template NAME for its first boot; every restore takes it from the chain. "" none */
	char cpu_template[CPU_TEMPLATE_NAME_MAX];
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
	/* The guest's /etc/machine-id, sent in every identity event: new for every sandbox
	 * (create, fork, create --from). "" in a spec from before: the guest keeps its own. */
	char machine_id[SBX_MACHINE_ID_LEN + 1];
};

/* Writes spec.json beneath dfd (temp file, fsync, rename): 0 or -errno. */
int sbx_spec_write(int dfd, const struct sbx_spec *s);
/* Reads and checks spec.json: 0 or -errno with one line in err. */
int sbx_spec_read(int dfd, struct sbx_spec *s, char *err, size_t errlen);
/* A fresh random machine id into s->machine_id: 0 or -errno. */
int sbx_spec_new_machine_id(struct sbx_spec *s);
/* 1 when id is SBX_MACHINE_ID_LEN lowercase hex digits, not all zero (systemd's rule). */
int sbx_machine_id_valid(const char *id);

/*
 * The guest part of a new spec for sandbox (or template) `name`: the kernel (s->kernel, or the
 * one sbx_guest_find finds), the root (initrd: an initramfs, no root disk; else rootfs, or the
 * image sbx_guest_find finds, as disk 0: a copy-on-write overlay of that shared base) and the
 * kernel command line naming the guest's hostname. Extra disks come after. 0 or -errno with
 * one line in err.
 */
int sbx_spec_guest(struct sbx_spec *s, const char *name, const char *rootfs, const char *initrd,
		   char *err, size_t errlen);

#endif
