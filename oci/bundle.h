/*
 * OCI runtime bundles and process objects (the OCI runtime spec's config.json), read for
 * cove-oci. A bundle comes from a container engine and is untrusted: the file is size-capped,
 * parsed by jansson, and every field is bounds-checked; a bad one is one line in err.
 */
#ifndef COVE_OCI_BUNDLE_H
#define COVE_OCI_BUNDLE_H

#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/rlimit_name.h"

#define OCI_CONFIG_MAX	     (4 << 20)	 /* config.json and --process files */
#define OCI_ARGS_MAX	     4096	 /* entries in process.args, and in process.env */
#define OCI_STRINGS_MAX	     (256 << 10) /* bytes of args + env together */
#define OCI_HOSTNAME_MAX     64
#define OCI_IMAGE_ANNOTATION "cove.dev/image" /* a cove image to boot instead of root.path */
#define OCI_MEM_ANNOTATION   "cove.dev/mem"   /* guest RAM, e.g. 512M */
#define OCI_VCPUS_ANNOTATION "cove.dev/vcpus"
/* CRI marks a pod's own container ("pause") so; it gets no VM (oci_state.holder). */
#define OCI_CRI_TYPE_ANNOTATION "io.kubernetes.cri.container-type"
#define OCI_POLICY_ANNOTATION	"cove.dev/policy" /* a policy of the host's set, by name */
#define OCI_POLICY_NAME_MAX	64

#define OCI_MOUNTS_MAX 64	 /* config.json's mounts */
#define OCI_COPY_MAX   (1 << 20) /* a file copied in for a bind mount (/etc/hosts, ...) */

/* What the guest does with a mount of config.json (oci_bundle.mounts). */
struct oci_mount {
	char dest[PATH_MAX];
	char source[PATH_MAX]; /* a copy-in's host file */
	bool copy;	       /* a small host file copied into the guest at dest */
	char size[32];	       /* a tmpfs's size= ("" none) */
};

/* The OCI runtime spec's "process": what runs in the container. */
struct oci_process {
	char **args; /* NULL-terminated; at least one */
	size_t nargs;
	char **env; /* NULL-terminated "K=V" */
	size_t nenv;
	char cwd[PATH_MAX]; /* absolute */
	uint32_t uid, gid;
	bool terminal;
	struct rlimit_val rlimits[RLIMITS_MAX]; /* process.rlimits, each type once */
	size_t nrlimits;
};

struct oci_bundle {
	char dir[PATH_MAX];    /* the bundle directory (absolute, resolved) */
	char rootfs[PATH_MAX]; /* root.path resolved against dir: a directory */
	bool readonly;
	char hostname[OCI_HOSTNAME_MAX + 1];
	struct oci_process process;
	char image[256];    /* cove.dev/image, "" none */
	uint64_t mem_bytes; /* cove.dev/mem, 0 none */
	int vcpus;	    /* cove.dev/vcpus, 0 none */
	bool holder;	    /* a pod's sandbox container (OCI_CRI_TYPE_ANNOTATION "sandbox") */
	char policy[OCI_POLICY_NAME_MAX + 1]; /* cove.dev/policy, "" none */
	char policy_file[PATH_MAX];	      /* its file, from the host's set (oci/host_conf.h) */
	json_t *annotations;		      /* the object (owned), for `state` */
	/* Mounts the guest honours beyond its own /proc, /dev, /sys, ...: tmpfs mounts, and the
	 * files engines bind in (/etc/hosts, /etc/hostname, /etc/resolv.conf,
	 * /run/.containerenv, /dev/termination-log), copied. Any other bind mount or device is
	 * refused when the bundle is read. */
	struct oci_mount *mounts;
	size_t nmounts;
};

/* Pure: config.json's hostname: 1 to 64 letters, digits, '-' and '.', not starting with '-' or
 * '.' ("" is valid: the guest keeps its own). */
bool oci_hostname_valid(const char *h);
/* Pure: a cove.dev/policy name, [a-z0-9][a-z0-9_-]{0,63}: never a path, never JSON. */
bool oci_policy_name_valid(const char *name);

/* process.rlimits (j: the array, or NULL) into p->rlimits: known RLIMIT_* types, each once, at
 * most RLIMITS_MAX, 0 <= soft <= hard. 0 or -EINVAL with one line naming the entry. */
int oci_rlimits_parse(json_t *j, struct oci_process *p, char *err, size_t errlen);

/* The process object j into p (freed with oci_process_free). 0 or -EINVAL with one line. */
int oci_process_parse(json_t *j, struct oci_process *p, char *err, size_t errlen);
/* A --process file (a process object in JSON). */
int oci_process_load(const char *path, struct oci_process *p, char *err, size_t errlen);
void oci_process_free(struct oci_process *p);

/*
 * config.json's "mounts" and "linux.devices" checked and planned (into b->mounts): the guest's
 * own file systems are left to it, tmpfs and the engines' small files are kept, and a host bind
 * mount, a device or another file system is refused, naming it. 0 or -EINVAL with one line.
 */
int oci_mounts_plan(json_t *config, struct oci_bundle *b, char *err, size_t errlen);

/* DIR/config.json into b (freed with oci_bundle_free). 0 or -errno with one line in err. */
int oci_bundle_load(const char *dir, struct oci_bundle *b, char *err, size_t errlen);
void oci_bundle_free(struct oci_bundle *b);

/* Pure: a JSON text (len bytes, capped) parsed into a process; for tests and the fuzzer. */
int oci_process_parse_text(const char *text, size_t len, struct oci_process *p, char *err,
			   size_t errlen);

#endif
