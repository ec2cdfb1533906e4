/* What the store holds by sandbox: its newest generation, when that was committed, removed. */
#ifndef COVE_LIFECYCLE_STORE_CATALOG_H
#define COVE_LIFECYCLE_STORE_CATALOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lifecycle/name.h"
#include "lifecycle/store/s3.h"

struct store_sandbox {
	char name[SBX_NAME_MAX + 1];
	uint64_t generations; /* committed ones still in the store */
	uint64_t newest;      /* the newest generation's number */
	int64_t committed;    /* its LastModified (seconds since the epoch), 0 unknown */
	bool removed;	      /* a tombstone */
};

/* Every sandbox under sandboxes/ (at most max), in name order. *out malloc'ed. 0 or -errno. */
int store_catalog(struct s3_client *c, size_t max, struct store_sandbox **out, size_t *n, char *err,
		  size_t errlen);

#endif
