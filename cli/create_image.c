/* cove create --image (cli/create_image.h). */
#include "cli/create_image.h"

#include "common/base64.h"
#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "common/file_io.h"
#include "image/cache.h"
#include "lifecycle/guest_files.h"
#include "lifecycle/name.h"
#include "lifecycle/root.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define INIT_CPIO "init.cpio.gz"
/* The kernel's x86 COMMAND_LINE_SIZE, with room for what cove adds at a restore. */
#define CMDLINE_ROOM 1600

/* {"argv": Entrypoint + Cmd, "env", "cwd", "user", "on_exit"} for cove-init's cove.main=. */
static char *main_json(json_t *cfg, const char *on_exit)
{
	json_t *argv = json_array(), *v;
	size_t i;
	json_array_foreach(json_object_get(cfg, "Entrypoint"), i, v) json_array_append(argv, v);
	json_array_foreach(json_object_get(cfg, "Cmd"), i, v) json_array_append(argv, v);
	json_t *m =
	    json_pack("{s:o,s:O,s:O,s:O,s:s}", "argv", argv, "env", json_object_get(cfg, "Env"),
		      "cwd", json_object_get(cfg, "WorkingDir"), "user",
		      json_object_get(cfg, "User"), "on_exit", on_exit);
	char *text = m ? json_dumps(m, JSON_COMPACT) : NULL;
	json_decref(m);
	return text;
}

int create_image_spec(struct sbx_spec *s, const char *name, const char *ref, const char *on_exit,
		      json_t **image, char *err, size_t errlen)
{
	struct sbx_root r = {.dfd = -1};
	char hex[DIGEST_HEX + 1], rootfs[PATH_MAX] = "";
	json_t *meta = NULL;
	int r_ = sbx_root_open(&r, true, err, errlen);
	if (r_)
		return r_;
	int cfd = image_cache_open(r.dfd, false, err, errlen);
	r_ = cfd < 0 ? cfd : image_resolve(cfd, ref, hex, err, errlen);
	if (!r_)
		r_ = image_meta_read(cfd, hex, &meta, err, errlen);
	if (cfd >= 0)
		close(cfd);
	/* The kernel and the directory of the guest build's root image, beside which
	 * guest/rootfs/build leaves init.cpio.gz. */
	if (!r_)
		r_ = sbx_guest_find(s->kernel, rootfs, sizeof(rootfs), err, errlen);
	char initrd[PATH_MAX];
	if (!r_) {
		char dir[PATH_MAX];
		snprintf(dir, sizeof(dir), "%s", rootfs);
		if ((size_t)snprintf(initrd, sizeof(initrd), "%s/%s", dirname(dir), INIT_CPIO) >=
			sizeof(initrd) ||
		    access(initrd, R_OK) < 0)
			r_ = errmsg(err, errlen, -ENOENT,
				    "%s: not there (guest/rootfs/build makes it beside the root "
				    "image)",
				    initrd);
	}
	/* The initramfs spec (kernel, command line naming NAME); disk 0 and cove.* follow. */
	if (!r_)
		r_ = sbx_spec_guest(s, name, NULL, initrd, err, errlen);
	if (!r_) {
		if ((size_t)snprintf(s->disks[0].path, sizeof(s->disks[0].path), "%.3900s/%s/%s/%s",
				     r.state, IMAGES_DIR, hex,
				     IMAGE_EXT4) >= sizeof(s->disks[0].path))
			r_ = errmsg(err, errlen, -ENAMETOOLONG,
				    "the state directory's path is too "
				    "long");
		s->disks[0].overlay = true;
		s->nr_disks = 1;
	}
	char *mj = r_ ? NULL : main_json(json_object_get(meta, "config"), on_exit);
	if (!r_ && !mj)
		r_ = -ENOMEM;
	if (!r_) {
		size_t n = strlen(mj);
		char *b64 = malloc(b64_enc_len(n) + 1);
		if (!b64) {
			r_ = -ENOMEM;
		} else {
			b64_encode((const uint8_t *)mj, n, b64);
			size_t base = strlen(s->cmdline);
			int len = snprintf(s->cmdline + base, sizeof(s->cmdline) - base,
					   " cove.root=/dev/vda cove.main=%s", b64);
			if (len < 0 || base + (size_t)len >= CMDLINE_ROOM)
				r_ =
				    errmsg(err, errlen, -E2BIG,
					   "image %s: its command, Env, WorkingDir and User take "
					   "%zu bytes of the kernel command line, more than it has "
					   "room for (%d)",
					   ref, b64_enc_len(n), CMDLINE_ROOM - 120);
			free(b64);
		}
	}
	free(mj);
	sbx_root_close(&r);
	if (!r_) {
		json_object_set_new(meta, "ref", json_string(ref));
		*image = meta;
	} else {
		json_decref(meta);
	}
	return r_;
}

int create_image_keep(int dfd, struct sbx_spec *s, const char *sandbox_dir, json_t *image,
		      char *err, size_t errlen)
{
	/* The same file system (both beneath the state root): a hard link costs nothing. */
	if (linkat(AT_FDCWD, s->disks[0].path, dfd, SBX_IMAGE_EXT4, 0) < 0 && errno != EEXIST)
		return errmsg(err, errlen, -errno, "cannot link the image's root: %s",
			      strerror(errno));
	if ((size_t)snprintf(s->disks[0].path, sizeof(s->disks[0].path), "%.4000s/%s", sandbox_dir,
			     SBX_IMAGE_EXT4) >= sizeof(s->disks[0].path))
		return errmsg(err, errlen, -ENAMETOOLONG, "the sandbox's path is too long");
	char *text = json_dumps(image, JSON_INDENT(2) | JSON_SORT_KEYS);
	int fd = text ? dirfd_create(dfd, "." SBX_IMAGE_JSON ".tmp", O_WRONLY | O_CLOEXEC, 0600)
		      : -ENOMEM;
	int r = fd < 0 ? fd : pwrite_full(fd, text, strlen(text), 0);
	if (fd >= 0)
		close(fd);
	free(text);
	if (!r)
		r = dirfd_rename(dfd, "." SBX_IMAGE_JSON ".tmp", SBX_IMAGE_JSON);
	return r ? errmsg(err, errlen, r, "cannot write %s: %s", SBX_IMAGE_JSON, strerror(-r)) : 0;
}

json_t *sandbox_image_read(int dfd)
{
	int fd = dirfd_open(dfd, SBX_IMAGE_JSON, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	struct stat st;
	json_t *j = NULL;
	if (fstat(fd, &st) == 0 && st.st_size < (1 << 20))
		j = json_loadfd(fd, JSON_REJECT_DUPLICATES, NULL);
	close(fd);
	if (!json_is_object(j) || !json_is_object(json_object_get(j, "config"))) {
		json_decref(j);
		return NULL;
	}
	return j;
}

json_t *image_exec_defaults(const char *name, json_t *env, const char **cwd, const char **user)
{
	struct sbx_root r = {.dfd = -1};
	char err[256];
	if (sbx_name_check(name, NULL, 0) || sbx_root_open(&r, false, err, sizeof(err)))
		return NULL;
	int dfd = sbx_dir_open(&r, name, false, err, sizeof(err));
	json_t *img = dfd < 0 ? NULL : sandbox_image_read(dfd);
	if (dfd >= 0)
		close(dfd);
	sbx_root_close(&r);
	if (!img)
		return NULL;
	json_t *cfg = json_object_get(img, "config"), *v;
	size_t i;
	json_t *merged = json_array();
	json_array_foreach(json_object_get(cfg, "Env"), i, v) if (json_is_string(v))
	    json_array_append(merged, v);
	json_array_extend(merged, env);
	json_array_clear(env);
	json_array_extend(env, merged);
	json_decref(merged);
	const char *wd = json_string_value(json_object_get(cfg, "WorkingDir"));
	const char *u = json_string_value(json_object_get(cfg, "User"));
	if (!*cwd && wd && *wd)
		*cwd = wd;
	if (!*user && u && *u)
		*user = u;
	return img;
}
