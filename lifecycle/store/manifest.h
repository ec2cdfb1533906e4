/*
 * A generation's manifest: the small record that commits one generation of a sandbox to the
 * store (sandboxes/NAME/gen/N.json) and names its blobs. What a host needs to start the sandbox
 * travels in it (memory, vCPUs, disks, the key provider's type, a broker policy id); no host
 * path and no command ever does: the host maps kernel and image blobs to its own cache, a
 * policy id to its own policy set, a provider type to its own key configuration.
 *
 * A host trusts a manifest only with a valid MAC, HMAC-SHA256 under the fleet key of its own
 * configuration, over "cove-manifest-v1" NL and the manifest without "mac" as compact JSON with
 * sorted keys. Everything else in it is checked as untrusted data even then.
 */
#ifndef COVE_LIFECYCLE_STORE_MANIFEST_H
#define COVE_LIFECYCLE_STORE_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lifecycle/name.h"
#include "lifecycle/spec.h"
#include "snapshot/digest.h"

#define STORE_MANIFEST_FORMAT	 "cove-generation-1"
#define STORE_MANIFEST_MAX	 (1u << 20) /* bytes of JSON, at most */
#define STORE_MANIFEST_MAX_FILES 4096
#define STORE_FILE_NAME_MAX	 80 /* a 64-hex-digit cache name fits */
#define STORE_POLICY_ID_MAX	 64
#define STORE_KEY_TYPE_MAX	 16
#define STORE_FLEET_KEY_MIN	 32 /* bytes */

struct store_file {
	char name[STORE_FILE_NAME_MAX]; /* a plain name: a chain file, or kernel, initrd, diskN-base
					 */
	uint64_t size;
	uint8_t digest[DIGEST_LEN]; /* "cove-sha256-tree" of the content: the blob's name */
};

struct store_disk {
	bool read_only, overlay;
};

struct store_manifest {
	char sandbox[SBX_NAME_MAX + 1];
	uint64_t generation; /* >= 1 */
	uint64_t lease;	     /* the epoch of the lease its writer held (0: written without one) */
	int64_t created_ms;
	uint64_t layer; /* the chain layer this generation restores */
	uint64_t mem_bytes;
	int vcpus;
	char cmdline[SBX_CMDLINE_MAX]; /* the guest kernel's: never read by the host */
	int nr_disks;
	struct store_disk disks[SBX_MAX_DISKS];
	uint64_t vsock_rate, snapshot_every_ms, idle_stop_ms;
	char key_type[STORE_KEY_TYPE_MAX];   /* "" plain, "key-cmd" or "pkcs11": a type only */
	char policy_id[STORE_POLICY_ID_MAX]; /* "" none; [a-z0-9][a-z0-9._-]* */
	size_t nr_files;
	struct store_file *files; /* malloc'ed; store_manifest_free */
};

/* The MAC'ed JSON text (malloc'ed, NUL-terminated) or NULL (-ENOMEM, or a field out of range:
 * err says which). The key is at least STORE_FLEET_KEY_MIN bytes. */
char *store_manifest_encode(const struct store_manifest *m, const uint8_t *key, size_t keylen,
			    char *err, size_t errlen);

/*
 * Checks and parses a manifest read from the store: at most STORE_MANIFEST_MAX bytes, the MAC
 * first (-EBADMSG "bad MAC" before any other field is looked at), then every field: unknown
 * ones, host paths, commands, names that are not plain, numbers out of range are refused with
 * one line naming them (-EINVAL). 0 fills *m (store_manifest_free it).
 */
int store_manifest_decode(const char *buf, size_t len, const uint8_t *key, size_t keylen,
			  struct store_manifest *m, char *err, size_t errlen);

void store_manifest_free(struct store_manifest *m);

/* A name a manifest may carry for a file: plain, [A-Za-z0-9][A-Za-z0-9._-]*, < 80 bytes. */
bool store_file_name_ok(const char *name);

#endif
