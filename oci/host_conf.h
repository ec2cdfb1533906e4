/*
 * cove-oci's host configuration: what the host's operator allows containers to ask for through
 * annotations (cove.dev/mem, cove.dev/vcpus, cove.dev/policy). A JSON file, by default
 * /etc/cove/oci.json (COVE_OCI_CONFIG names another), e.g.
 *   {"max_mem":"4G","max_vcpus":4,"policies":{"web":"/etc/cove/policies/web.json"},
 *    "max_root_disks":32}
 * A missing file gives the defaults (2G, 2 vCPUs, no policies, 32 root disks). The bundle is
 * untrusted, this file is the operator's: the annotations are checked against it.
 */
#ifndef COVE_OCI_HOST_CONF_H
#define COVE_OCI_HOST_CONF_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "oci/bundle.h"

#define OCI_HOST_CONF_ENV	     "COVE_OCI_CONFIG"
#define OCI_HOST_CONF_DEFAULT	     "/etc/cove/oci.json"
#define OCI_HOST_CONF_MAX	     (64 << 10)
#define OCI_HOST_POLICIES_MAX	     64
#define OCI_HOST_MEM_DEFAULT	     (2ULL << 30)
#define OCI_HOST_VCPUS_DEFAULT	     2
#define OCI_HOST_SANDBOX_MEM_DEFAULT (256ULL << 20) /* cove create's --mem default */
#define OCI_HOST_ROOT_DISKS_DEFAULT  32		    /* root disks kept (oci/root_cache.h) */

struct oci_host_policy {
	char name[OCI_POLICY_NAME_MAX + 1];
	char path[PATH_MAX]; /* absolute */
};

struct oci_host_conf {
	char path[PATH_MAX];	 /* the file read (or missing), for messages */
	uint64_t max_mem;	 /* bytes, 64M..64G */
	int max_vcpus;		 /* 1..64 */
	unsigned max_root_disks; /* 1..4096: container roots kept as disks */
	struct oci_host_policy *policies;
	size_t npolicies;
};

/*
 * path (NULL: $COVE_OCI_CONFIG, else OCI_HOST_CONF_DEFAULT) into c (freed with
 * oci_host_conf_free). A missing file is the defaults; a file over 64 KiB, not JSON, with an
 * unknown key or a bad field is refused. 0 or -errno with one line in err.
 */
int oci_host_conf_load(const char *path, struct oci_host_conf *c, char *err, size_t errlen);
void oci_host_conf_free(struct oci_host_conf *c);

/*
 * The bundle's annotations against c: cove.dev/mem over max_mem or cove.dev/vcpus over
 * max_vcpus is refused, and so is a cove.dev/policy c does not name; a named one's file goes
 * into b->policy_file. No cove.dev/mem and a cap below cove create's default: the cap.
 * 0 or -EINVAL with one line.
 */
int oci_host_conf_apply(const struct oci_host_conf *c, struct oci_bundle *b, char *err,
			size_t errlen);

#endif
