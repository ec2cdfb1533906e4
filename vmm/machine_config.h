/* The machine a snapshot was taken of (RAM, vCPUs, disks, vsock), as JSON in the state file, so restore can rebuild it. */
#ifndef COVE_MACHINE_CONFIG_H
#define COVE_MACHINE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "board.h"
#include "options.h"

struct machine_config {
	uint64_t mem_size;
	int vcpus;
	int nr_disks;
	struct disk_opt disks[RUN_MAX_DISKS];
	struct disk_chain chains[RUN_MAX_DISKS]; /* frozen overlay layers under each disk's top */
	uint64_t vsock_cid; /* 0: none */
	char vsock_uds[108];
};

/* malloc'd JSON text describing the machine `o` builds, or NULL without memory. */
char *machine_config_json(const struct run_opts *o);
/* The same for a machine config (with its disks' frozen overlay layers). */
char *machine_config_to_json(const struct machine_config *mc);
/* Pure: parses and range-checks that JSON (untrusted: it comes from a file). -EINVAL + `err`. */
int machine_config_parse(const char *json, size_t len, struct machine_config *mc, char *err,
			 size_t errlen);

#endif
