/* The machine a snapshot was taken of (RAM, vCPUs, disks, vsock), as JSON in the state file, so
 * restore can rebuild it. */
#ifndef COVE_MACHINE_CONFIG_H
#define COVE_MACHINE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "devices/board.h"
#include "sandbox/options.h"
#include "vmm/cpu_template.h"

/*
 * Format 2: the saved description names no host path. Disks are described by size, ro and
 * whether they sit under an overlay; their frozen overlay layers by plain names inside the
 * chain directory; vsock by its CID only. Restore takes every host path from its command line.
 */
#define MACHINE_CONFIG_FORMAT 2

struct machine_config {
	uint64_t mem_size;
	int vcpus;
	int nr_disks;
	struct disk_opt disks[RUN_MAX_DISKS]; /* host paths: from the command line, never a file */
	uint64_t disk_size[RUN_MAX_DISKS];    /* bytes of each disk (the base under an overlay) */
	struct disk_chain chains[RUN_MAX_DISKS]; /* frozen overlay layers under each disk's top */
	uint64_t vsock_cid;			 /* 0: none */
	char vsock_uds[108];
	uint64_t vsock_rate; /* host configuration like vsock_uds: never saved */
	/* Table devices configured by their own option and spec hooks ("devices" in the JSON). */
	int nr_devs;
	struct device_spec devs[BOARD_MAX_VIRTIO];
	/* The CPU template the guest booted with ("cpu_template": absent without one): every
	 * restore applies it again, so the guest never sees more than it booted with. */
	char cpu_template[CPU_TEMPLATE_NAME_MAX];
};

/*
 * malloc'd JSON text describing the machine, or NULL without memory. Frozen layers are written as
 * their file names (the caller keeps them inside the chain directory), host paths are left out.
 */
char *machine_config_to_json(const struct machine_config *mc);
/*
 * Pure: parses and range-checks that JSON (untrusted: it comes from a file). Disk paths and
 * the vsock socket come back empty; layer names are plain names. -EINVAL + `err`.
 */
int machine_config_parse(const char *json, size_t len, struct machine_config *mc, char *err,
			 size_t errlen);
/* Size in bytes of a disk image or block device at `path` (host side). 0 or -errno. */
int machine_disk_size(const char *path, uint64_t *size);

#endif
