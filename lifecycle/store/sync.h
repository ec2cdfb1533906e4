/*
 * Generations between a host and the store (lifecycle/store/STORE.md, "Layout"):
 *
 *   blobs/sha256/<digest>                 one per distinct file content, create-only
 *   sandboxes/<name>/gen/<N, 20 digits>.json   a generation's manifest, written last, create-only
 *   sandboxes/<name>/tombstone            `cove rm`: the sandbox is gone everywhere
 *
 * Upload: every file of the chain's newest generation (and the sandbox's kernel, initrd and disk
 * bases) packed and hashed here, each blob sent unless the store has it, then the manifest of
 * generation N+1 by a create-only PUT: two writers can never both commit N. Fetch: the newest
 * manifest (or a given one), its MAC checked, every blob checked against its digest before it
 * is placed; images go to the host's cache by digest, never to a path from the store.
 * With `lazy` (lifecycle/lazy_files.h), memory layers that have a chunk list in the store are
 * made as sparse files holding only their header and bitmaps, and recorded there: the fetcher
 * (lazy_fetch.h) brings the rest while the guest runs.
 */
#ifndef COVE_LIFECYCLE_STORE_SYNC_H
#define COVE_LIFECYCLE_STORE_SYNC_H

#include <stddef.h>
#include <stdint.h>

#include "lifecycle/spec.h"
#include "lifecycle/store/manifest.h"
#include "lifecycle/store/s3.h"

#define STORE_BLOB_PREFIX "blobs/sha256/"
/* A memory layer blob's chunk SHA-256s, in order (issue 29, lazy restore): 32 bytes each. Named
 * by the blob's digest, which they must give again (digest_from_chunks) to be believed. */
#define STORE_CHUNKS_PREFIX "chunks/sha256/"
#define STORE_SBX_PREFIX    "sandboxes/"
/* Templates (`cove template`): templates/<T>/gen/<N>.json, blobs shared with the sandboxes. In
 * the functions below a store name "@T" is template T, any other name a sandbox. */
#define STORE_TPL_PREFIX     "templates/"
#define STORE_TPL_MARK	     '@'
#define STORE_TOMBSTONE	     "tombstone"
#define STORE_SINGLE_PUT_MAX (16u << 20) /* larger blobs go up as a multipart upload */

struct store_keyring {
	const uint8_t *fleet_key; /* the host's own configuration: MACs every manifest */
	size_t fleet_key_len;
};

/* Files uploaded before, by name and (device, inode, size, mtime, ctime): a follower does not
 * hash or send an unchanged layer again. A write through a kept fd changes ctime. */
struct store_upload_cached {
	char name[STORE_FILE_NAME_MAX];
	unsigned long long dev, ino, size;
	long long mtime_ns, ctime_ns;
	struct store_file f;
};
struct store_upload_cache {
	struct store_upload_cached *e;
	size_t n, cap;
};
void store_upload_cache_free(struct store_upload_cache *c);

struct store_upload_src {
	const char *name;      /* the sandbox */
	const char *chain_dir; /* its chain directory (no VMM writing a newer commit into it) */
	const struct sbx_spec *spec; /* the host's spec: machine, kernel, initrd, disk bases */
	const char *image_json;	     /* NAME/image.json (made from an OCI image), NULL: none */
	const char *policy_id;	     /* the broker policy's id in the host's policy set, "" none */
	const char *key_type;	     /* "" plain, "key-cmd" or "pkcs11" */
	int stage_dfd;		     /* host scratch directory for packed blobs */
	struct store_upload_cache *cache; /* NULL: hash and check every file */
	/*
	 * Fenced commits (issue 30): with `fenced`, the generation is base + 1, the one after the
	 * generation this chain was built on, never "the newest + 1": a host whose lease moved on
	 * finds that number taken (the new owner commits it first) and its create-only PUT is
	 * refused, -ESTALE. lease: the epoch the manifest names.
	 */
	bool fenced;
	uint64_t base;
	uint64_t lease;
	/* Files this host is still fetching (lifecycle/lazy_files.h): the store has them under
	 * these digests; they are neither read nor sent. */
	const struct store_file *lazy;
	size_t nr_lazy;
	/* The host's digest stamps (lifecycle/vmm_args.h SBX_DIGEST_STAMPS), or NULL: a file whose
	 * status is still the one stamped with its recorded digest is not read again when the
	 * store has its blob. */
	const char *stamps;
};

struct store_sync_stats {
	uint64_t generation;
	uint64_t files;		/* files in the generation */
	uint64_t blobs_sent;	/* blobs uploaded */
	uint64_t blobs_present; /* blobs the store already had */
	uint64_t bytes_sent;	/* blob bytes uploaded */
};

/* This host's counters (lifecycle/store_stats.h) after an upload that returned r. */
void store_stats_note_upload(int dfd, int r, const struct store_sync_stats *st);

/* Uploads the newest generation of src->chain_dir as generation N+1. -EEXIST: another host
 * committed that generation first; -EIDRM: the sandbox has a tombstone. 0 or -errno + err. */
int store_upload_generation(struct s3_client *c, const struct store_upload_src *src,
			    const struct store_keyring *kr, struct store_sync_stats *st, char *err,
			    size_t errlen);

/*
 * The newest committed generation of `name` (*gen, 0 when the store has none), or -EIDRM when
 * it has a tombstone. 0 or -errno + err.
 */
int store_newest_generation(struct s3_client *c, const char *name, uint64_t *gen, char *err,
			    size_t errlen);

/*
 * Fetches generation `gen` (0: the newest) of `name`: the manifest (MAC, then every field,
 * checked; it must name this sandbox and generation) into *m, its chain files placed into
 * chain_dfd (empty), its images (kernel, initrd, diskN-base) into images_dfd named by their
 * digest (kept: a later fetch finds them there). 0 or -errno with one line in err naming the
 * blob or manifest that failed; nothing partly fetched is ever left under a final name.
 */
struct sbx_lazy;
int store_fetch_generation(struct s3_client *c, const char *name, uint64_t gen,
			   const struct store_keyring *kr, int chain_dfd, int images_dfd,
			   struct sbx_lazy *lazy, struct store_manifest *m,
			   struct store_sync_stats *st, char *err, size_t errlen);

/* Generation `gen`'s manifest of `name` into *m: its MAC, every field, and that it names this
 * sandbox and generation checked. 0 (store_manifest_free it) or -errno + err. */
int store_manifest_fetch(struct s3_client *c, const char *name, uint64_t gen,
			 const struct store_keyring *kr, struct store_manifest *m, char *err,
			 size_t errlen);

/* Writes the tombstone of `name` (create-only; one that exists is success). */
int store_put_tombstone(struct s3_client *c, const char *name, char *err, size_t errlen);

/*
 * The key prefix of store name `name`: "sandboxes/NAME/", or "templates/T/" for "@T", the name
 * checked as a sandbox's or a template's. 0, -EINVAL (one line in err) or -ENAMETOOLONG.
 */
int store_name_dir(const char *name, char *dir, size_t cap, char *err, size_t errlen);

/* The key of the blob with digest d. */
void store_blob_key(const uint8_t d[DIGEST_LEN], char *key, size_t cap);
/* The key of the chunk list of the blob with digest d. */
void store_chunks_key(const uint8_t d[DIGEST_LEN], char *key, size_t cap);
/* True for the chain files a host may fetch lazily (memory layers, "mem-..."). */
bool store_lazy_name(const char *name);

/* True for the names store_upload_generation gives the sandbox's images. */
bool store_image_name(const char *name);
/* The file name a manifest gives an image sandbox's record (lifecycle/image_files.h). */
#define STORE_IMAGE_JSON "image-json"

#endif
