/* A bundle's root directory as a cove image (cli/oci.h). */
#include "cli/oci.h"

#include <errno.h>
#include <fcntl.h>
#include <fts.h>
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

#define FREE_BYTES (1ULL << 30) /* room for the container's own files; sparse */

/* Bytes (allocated) and entries beneath a root, counted without following links. */
struct tree_count {
	uint64_t bytes, entries;
};

static int count_tree(const char *root, struct tree_count *c)
{
	char *paths[] = {(char *)root, NULL};
	FTS *f = fts_open(paths, FTS_PHYSICAL | FTS_NOCHDIR | FTS_XDEV, NULL);
	FTSENT *e;
	int r = 0;

	memset(c, 0, sizeof(*c));
	if (!f)
		return -errno;
	while ((e = fts_read(f))) {
		if (e->fts_info == FTS_DP)
			continue;
		if (e->fts_info == FTS_DNR || e->fts_info == FTS_ERR || e->fts_info == FTS_NS) {
			r = -(e->fts_errno ? e->fts_errno : EIO);
			break;
		}
		c->entries++;
		if (e->fts_info == FTS_F)
			c->bytes += (uint64_t)e->fts_statp->st_blocks * 512;
	}
	fts_close(f);
	return r;
}

static int write_meta(int dfd, const char *hex, const struct oci_bundle *b, const char *user)
{
	json_t *env = json_array();
	for (size_t i = 0; i < b->process.nenv; i++)
		json_array_append_new(env, json_string(b->process.env[i]));
	json_t *j = json_pack("{s:i,s:s+,s:s,s:s,s:{s:o,s:s,s:s},s:I}", "version", 1, "digest",
			      "sha256:", hex, "kind", "oci-bundle", "source", b->rootfs, "config",
			      "Env", env, "WorkingDir", b->process.cwd, "User", user,
			      "imported_unix", (json_int_t)time(NULL));
	char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
	json_decref(j);
	if (!text)
		return -ENOMEM;
	int fd = dirfd_create(dfd, IMAGE_JSON, O_WRONLY | O_CLOEXEC, 0600);
	int r = fd < 0 ? fd : pwrite_full(fd, text, strlen(text), 0);
	if (fd >= 0)
		close(fd);
	free(text);
	return r;
}

/* The cache's entry hex (its ext4 and record, then the directory), as far as it got made. */
static void remove_entry(int cfd, const char *hex)
{
	int dfd = openat(cfd, hex, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd >= 0) {
		unlinkat(dfd, IMAGE_EXT4, 0);
		unlinkat(dfd, IMAGE_JSON, 0);
		close(dfd);
	}
	unlinkat(cfd, hex, AT_REMOVEDIR);
}

int oci_disk_build(struct oci_ctx *x, const struct oci_bundle *b, const char *sandbox, char *ref,
		   size_t cap)
{
	struct sbx_root r = {.dfd = -1};
	char hex[DIGEST_HEX + 1], out[PATH_MAX + 200], user[32];
	unsigned char rnd[32];
	struct tree_count c;
	int cfd = -1, dfd = -1, ret;
	double t0 = mono_s();

	if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
		return errmsg(x->err, sizeof(x->err), -EIO, "no random bytes");
	/* Not an image's digest: a name no import can take (an import's is a manifest's). */
	for (size_t i = 0; i < sizeof(rnd); i++)
		snprintf(hex + 2 * i, 3, "%02x", rnd[i]);
	snprintf(ref, cap, "oci/%s", sandbox);
	snprintf(user, sizeof(user), "%u:%u", b->process.uid, b->process.gid);
	ret = sbx_root_open(&r, true, x->err, sizeof(x->err));
	if (ret)
		return ret;
	cfd = image_cache_open(r.dfd, true, x->err, sizeof(x->err));
	if (cfd < 0) {
		ret = cfd;
		goto out;
	}
	if (mkdirat(cfd, hex, 0700) < 0) {
		ret =
		    errmsg(x->err, sizeof(x->err), -errno, "images directory: %s", strerror(errno));
		goto out;
	}
	dfd = openat(cfd, hex, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	ret = dfd < 0 ? -errno : count_tree(b->rootfs, &c);
	if (ret) {
		errmsg(x->err, sizeof(x->err), ret, "%s: cannot walk it", b->rootfs);
		goto undo;
	}
	snprintf(out, sizeof(out), "%s/%s/%s/%s", r.state, IMAGES_DIR, hex, IMAGE_EXT4);
	uint64_t size = ext4_size_for(c.bytes, c.entries, FREE_BYTES);
	ret = ext4_build(b->rootfs, out, size, c.entries, x->err, sizeof(x->err));
	if (!ret && (ret = write_meta(dfd, hex, b, user)))
		errmsg(x->err, sizeof(x->err), ret, "cannot write %s: %s", IMAGE_JSON,
		       strerror(-ret));
	if (!ret)
		ret = image_ref_set(cfd, ref, hex, x->err, sizeof(x->err));
	if (ret)
		goto undo;
	log_info(x->log, "%s: root %s made an ext4: %llu entries, %llu MiB, in %.0f ms", sandbox,
		 b->rootfs, (unsigned long long)c.entries, (unsigned long long)(c.bytes >> 20),
		 (mono_s() - t0) * 1000);
	goto out;
undo:
	remove_entry(cfd, hex);
out:
	if (dfd >= 0)
		close(dfd);
	if (cfd >= 0)
		close(cfd);
	sbx_root_close(&r);
	return ret;
}

void oci_disk_drop(const char *ref)
{
	struct sbx_root r = {.dfd = -1};
	char hex[DIGEST_HEX + 1], err[256];
	if (sbx_root_open(&r, false, err, sizeof(err)))
		return;
	int cfd = image_cache_open(r.dfd, false, err, sizeof(err));
	if (cfd >= 0 && image_resolve(cfd, ref, hex, err, sizeof(err)) == 0) {
		image_ref_set(cfd, ref, NULL, err, sizeof(err));
		remove_entry(cfd, hex);
	}
	if (cfd >= 0)
		close(cfd);
	sbx_root_close(&r);
}
