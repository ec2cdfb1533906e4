/* A disk as the host describes it: image path, read-only, copy-on-write overlay. */
#ifndef COVE_DISK_SPEC_H
#define COVE_DISK_SPEC_H

#include <stdbool.h>

#include "common/rate_limiter.h"

#define RUN_MAX_DISKS	  8
#define RUN_DISK_PATH_MAX 4096

/*
 * One --disk PATH[,ro|,overlay=OVL][,bw=RATE][,iops=N][,burst=SIZE][,iops-burst=N]: the guest
 * sees them as /dev/vda, /dev/vdb... in order. The limits are host configuration: never saved
 * in a snapshot (a restore takes them from its own command line).
 */
struct disk_opt {
	char path[RUN_DISK_PATH_MAX];
	bool read_only;
	char overlay[RUN_DISK_PATH_MAX]; /* copy-on-write overlay over the read-only PATH; "" if
					    none */
	struct rate_limit rate;		 /* all 0: no limit */
};

#endif
