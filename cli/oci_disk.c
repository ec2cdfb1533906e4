/* A bundle's root directory as a cove image (cli/oci.h). */
#include "cli/oci.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/clock.h"
#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "common/file_io.h"
#include "image/cache.h"
#include "image/ext4.h"
#include "lifecycle/root.h"
#include "oci/root_cache.h"
#include "oci/tree_digest.h"

#define FREE_BYTES (1ULL << 30) /* room for the container's own files; sparse */
#define ROOT_REF   "oci-root/"	/* + the tree digest: the cache's name of a root's disk */

/* The disk's record: no container's settings (cove-oci gives each exec its own), so that every
 * container of one root shares the disk and its implicit template. */
static int write_meta(int dfd, const struct oci_tree_sum *sum)
{
	struct stat st;
	if (fstatat(dfd, IMAGE_EXT4, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	json_t *j = json_pack(
	    "{s:i,s:s+,s:s,s:s+,s:{s:[s],s:s,s:s},s:I,s:I,s:I,s:I}", "version", 1, "digest",
	    "sha256:", sum->hex, "kind", "oci-root", "source", "cove-oci root ", sum->hex, "config",
	    "Env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	    "WorkingDir", "/", "User", "0:0", "unpacked_bytes", (json_int_t)sum->file_bytes,
	    "ext4_bytes", (json_int_t)st.st_size, "entries", (json_int_t)sum->entries,
	    "imported_unix", (json_int_t)time(NULL));
	char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
	json_decref(j);
	if (!text)
		return -ENOMEM;
	int fd = dirfd_create(dfd, IMAGE_JSON, O_WRONLY | O_CLOEXEC, 0600);
	int r = fd < 0 ? fd : pwrite_full(fd, text, strlen(text), 0);
	if (fd >= 0) {
		if (!r && fsync(fd) < 0)
			r = -errno;
		close(fd);
	}
	free(text);
	return r;
}

/* Whether the cache holds a whole entry hex (a disk and its record). */
static bool entry_whole(int cfd, const char *hex)
{
	char p[DIGEST_HEX + 32];
	struct stat st;
	snprintf(p, sizeof(p), "%s/%s", hex, IMAGE_JSON);
	if (fstatat(cfd, p, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
		return false;
	snprintf(p, sizeof(p), "%s/%s", hex, IMAGE_EXT4);
	return fstatat(cfd, p, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
}

/*
 * The disk made in a fresh entry, then moved to its digest's name once a second walk finds the
 * root unchanged (a root that changed while mkfs read it is refused, not cached). Two creates of
 * one root at once both build; the first rename wins and the other's entry is removed.
 */
static int build_entry(struct oci_ctx *x, int cfd, const char *state, const char *rootfs,
		       const char *const *replaced, size_t n, const struct oci_tree_sum *sum)
{
	char tmp[40], out[PATH_MAX + 200];
	unsigned char rnd[8];
	struct oci_tree_sum again;
	int dfd = -1, r;

	if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
		return errmsg(x->err, sizeof(x->err), -EIO, "no random bytes");
	snprintf(tmp, sizeof(tmp), "building-");
	for (size_t i = 0; i < sizeof(rnd); i++)
		snprintf(tmp + 9 + 2 * i, 3, "%02x", rnd[i]);
	if (mkdirat(cfd, tmp, 0700) < 0)
		return errmsg(x->err, sizeof(x->err), -errno, "images directory: %s",
			      strerror(errno));
	dfd = openat(cfd, tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0) {
		r = errmsg(x->err, sizeof(x->err), -errno, "images directory: %s", strerror(errno));
		goto undo;
	}
	snprintf(out, sizeof(out), "%s/%s/%s/%s", state, IMAGES_DIR, tmp, IMAGE_EXT4);
	uint64_t size = ext4_size_for(sum->alloc_bytes, sum->entries, FREE_BYTES);
	if ((r = ext4_build(rootfs, out, size, sum->entries, x->err, sizeof(x->err))))
		goto undo;
	if ((r = write_meta(dfd, sum))) {
		errmsg(x->err, sizeof(x->err), r, "cannot write %s: %s", IMAGE_JSON, strerror(-r));
		goto undo;
	}
	if ((r = oci_tree_digest(rootfs, replaced, n, &again, x->err, sizeof(x->err))))
		goto undo;
	if (strcmp(again.hex, sum->hex)) {
		r = errmsg(x->err, sizeof(x->err), -EAGAIN, "%s changed while its disk was made",
			   rootfs);
		goto undo;
	}
	if (renameat(cfd, tmp, cfd, sum->hex) == 0)
		goto out;
	if (errno != EEXIST && errno != ENOTEMPTY) {
		r = errmsg(x->err, sizeof(x->err), -errno, "images directory: %s", strerror(errno));
		goto undo;
	}
	if (!entry_whole(cfd, sum->hex)) {
		r = errmsg(x->err, sizeof(x->err), -EEXIST, "images: a broken entry %.16s...",
			   sum->hex);
		goto undo;
	}
undo: /* also when another create's entry won */
	oci_root_entry_remove(cfd, tmp);
out:
	if (dfd >= 0)
		close(dfd);
	return r;
}

int oci_disk_build(struct oci_ctx *x, const struct oci_bundle *b, const char *sandbox, char *ref,
		   size_t cap)
{
	struct sbx_root r = {.dfd = -1};
	struct oci_tree_sum sum;
	int cfd = -1, ret;
	double t0 = mono_s(), t1;

	const char *replaced[OCI_MOUNTS_MAX];
	size_t n = 0;
	for (size_t i = 0; i < b->nmounts && n < OCI_MOUNTS_MAX; i++)
		if (b->mounts[i].copy)
			replaced[n++] = b->mounts[i].dest;
	if ((ret = oci_tree_digest(b->rootfs, replaced, n, &sum, x->err, sizeof(x->err))))
		return ret;
	t1 = mono_s();
	snprintf(ref, cap, "%s%s", OCI_ROOT_REF, sum.hex);
	ret = sbx_root_open(&r, true, x->err, sizeof(x->err));
	if (ret)
		return ret;
	cfd = image_cache_open(r.dfd, true, x->err, sizeof(x->err));
	if (cfd < 0) {
		ret = cfd;
		goto out;
	}
	bool cached = entry_whole(cfd, sum.hex);
	if (!cached && (ret = build_entry(x, cfd, r.state, b->rootfs, replaced, n, &sum)))
		goto out;
	ret = image_ref_set(cfd, ref, sum.hex, x->err, sizeof(x->err));
	if (ret)
		goto out;
	oci_root_touch(cfd, sum.hex);
	/* Beyond the host's bound, the least recently used roots go (a sandbox or template made
	 * from one keeps its own link). A failure here fails no container. */
	if (!cached && x->max_root_disks) {
		char err[256];
		int n = oci_root_trim(cfd, x->max_root_disks, sum.hex, err, sizeof(err));
		if (n > 0)
			log_info(x->log, "%s: %d root disks removed (max_root_disks %u)", sandbox,
				 n, x->max_root_disks);
		else if (n < 0)
			log_info(x->log, "%s: root disks not trimmed: %s", sandbox, err);
	}
	if (cached)
		log_info(x->log,
			 "%s: root %s (%llu entries, %llu MiB) is cached disk %.16s: no disk made "
			 "(digest %.0f ms)",
			 sandbox, b->rootfs, (unsigned long long)sum.entries,
			 (unsigned long long)(sum.file_bytes >> 20), sum.hex, (t1 - t0) * 1000);
	else
		log_info(x->log,
			 "%s: root %s made an ext4 %.16s: %llu entries, %llu MiB, in %.0f ms "
			 "(digest %.0f ms of it)",
			 sandbox, b->rootfs, sum.hex, (unsigned long long)sum.entries,
			 (unsigned long long)(sum.file_bytes >> 20), (mono_s() - t0) * 1000,
			 (t1 - t0) * 1000);
out:
	if (cfd >= 0)
		close(cfd);
	sbx_root_close(&r);
	return ret;
}
