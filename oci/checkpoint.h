/*
 * cove-oci's checkpoint record: D/cove/checkpoint.json beside the packed chain D/cove/archive/
 * (D: the engine's --image-path). A checkpoint comes back from elsewhere (podman's export
 * travels between hosts) and is untrusted: the record is size-capped, parsed by jansson and
 * every field checked; the archive is checked entry by entry as it unpacks (lifecycle/import.h).
 * Nothing in it names a host path: the restoring host finds the root disk itself, by the
 * digest of the bundle it is given, and refuses a bundle whose root differs.
 */
#ifndef COVE_OCI_CHECKPOINT_H
#define COVE_OCI_CHECKPOINT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define OCI_CKPT_DIR	 "cove"		   /* beneath --image-path */
#define OCI_CKPT_RECORD	 "checkpoint.json" /* in OCI_CKPT_DIR */
#define OCI_CKPT_ARCHIVE "archive"	   /* in OCI_CKPT_DIR: sbx_archive_pack's output */
#define OCI_CKPT_MAX	 (64 << 10)	   /* the record's size cap */
#define OCI_CKPT_VERSION 1

struct oci_ckpt {
	char root[256]; /* the root disk's cove image name: oci-root/<digest>, or cove.dev/image */
	char session[32];   /* the container process's exec session in the guest ("s" + digits) */
	uint64_t mem_bytes; /* the VM's, which the chain was taken with */
	int vcpus;
	int64_t created_ms;
};

/* Pure: the record as JSON (the caller owns it); NULL when out of memory. */
json_t *oci_ckpt_json(const struct oci_ckpt *c);
/* Pure: text (len bytes, untrusted) checked into c. 0 or -EINVAL/-E2BIG with one line in err. */
int oci_ckpt_parse(const char *text, size_t len, struct oci_ckpt *c, char *err, size_t errlen);

#endif
