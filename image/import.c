/* The import (image/import.h): source -> plan -> layers -> ext4 -> cache entry -> name. */
#include "image/import.h"

#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "common/file_io.h"
#include "image/ext4.h"
#include "image/image_config.h"
#include "image/plan.h"
#include "image/source.h"
#include "image/unpack.h"
#include "lifecycle/tree.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_ENTRIES 2000000ULL

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The name an image gets without --name: the source's, else its file name without suffix. */
static int default_name(const struct import_opts *o, const struct image_plan *p,
			const struct image_source *s, char *out, size_t cap, char *err,
			size_t errlen)
{
	if (o->name) {
		if (!image_name_ok(o->name))
			return errmsg(err, errlen, -EINVAL,
				      "--name %.100s: use letters, digits and ._/:@- (at most %d)",
				      o->name, IMAGE_NAME_MAX);
		snprintf(out, cap, "%s", o->name);
		return 0;
	}
	bool bare_tag = !strchr(p->ref, '/') && !strchr(p->ref, ':');
	if (p->ref[0] && image_name_ok(p->ref) && strcmp(p->ref, "cove") && !bare_tag) {
		snprintf(out, cap, "%s", p->ref);
		return 0;
	}
	/* containers-storage:REF: the name is REF. */
	if (!strcmp(s->kind, "containers-storage") &&
	    image_name_ok(o->source + strlen("containers-storage:"))) {
		snprintf(out, cap, "%s", o->source + strlen("containers-storage:"));
		return 0;
	}
	const char *src = o->source, *c = strchr(src, ':');
	if (c && strncmp(src, "/", 1) && strncmp(src, ".", 1))
		src = c + 1; /* TRANSPORT: */
	char tmp[PATH_MAX];
	snprintf(tmp, sizeof(tmp), "%s", src);
	size_t n = strlen(tmp);
	while (n > 1 && tmp[n - 1] == '/')
		tmp[--n] = '\0';
	const char *b = strrchr(tmp, '/') ? strrchr(tmp, '/') + 1 : tmp;
	char base[IMAGE_NAME_MAX + 1];
	snprintf(base, sizeof(base), "%.200s", b);
	char *dot = strchr(base, '.');
	if (dot && dot != base)
		*dot = '\0';
	(void)s;
	/* An OCI ref.name that is only a tag ("latest", as umoci writes it) goes after it. */
	if (p->ref[0] && bare_tag && strcmp(p->ref, "cove") &&
	    strlen(base) + 1 + strlen(p->ref) < sizeof(base)) {
		strcat(base, ":");
		strcat(base, p->ref);
	}
	if (!image_name_ok(base))
		return errmsg(err, errlen, -EINVAL, "the image has no usable name: give --name");
	snprintf(out, cap, "%s", base);
	return 0;
}

/* Work directories an import left when it died (kill -9, a crash) an hour or more ago: an
 * import still running is younger. They can hold a whole unpacked image. */
static void sweep_work(int cachefd, struct logger *log)
{
	int fd = openat(cachefd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd < 0 ? NULL : fdopendir(fd);
	if (!d) {
		if (fd >= 0)
			close(fd);
		return;
	}
	time_t now = time(NULL);
	struct dirent *de;
	while ((de = readdir(d))) {
		struct stat st;
		if (strncmp(de->d_name, ".import-", 8) ||
		    fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISDIR(st.st_mode) || now - st.st_mtime < 3600)
			continue;
		if (sbx_tree_remove(dirfd(d), de->d_name) == 0 && log)
			log_info(log, "removed %s, left by an import that did not finish",
				 de->d_name);
	}
	closedir(d);
}

static int make_work(int cachefd, char *tmp, size_t cap, char *err, size_t errlen)
{
	for (int i = 0; i < 16; i++) {
		uint32_t rnd = 0;
		if (getrandom(&rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
			return -EIO;
		snprintf(tmp, cap, ".import-%08x", rnd);
		if (mkdirat(cachefd, tmp, 0700) == 0)
			return 0;
		if (errno != EEXIST)
			return errmsg(err, errlen, -errno, "cannot make a work directory: %s",
				      strerror(errno));
	}
	return -EEXIST;
}

static int write_meta(int wfd, const struct image_plan *p, const struct image_source *s,
		      json_t *cfg, const struct import_result *res)
{
	json_t *j = json_pack(
	    "{s:i,s:s+,s:s,s:s,s:O,s:I,s:I,s:I,s:I,s:I}", "version", 1, "digest", "sha256:", p->key,
	    "kind", s->kind, "source", s->label, "config", cfg, "layers", (json_int_t)res->layers,
	    "entries", (json_int_t)res->entries, "unpacked_bytes", (json_int_t)res->bytes,
	    "ext4_bytes", (json_int_t)res->ext4_bytes, "imported_unix", (json_int_t)time(NULL));
	char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
	json_decref(j);
	if (!text)
		return -ENOMEM;
	int fd = dirfd_create(wfd, IMAGE_JSON, O_WRONLY | O_CLOEXEC, 0600);
	int r = fd < 0 ? fd : pwrite_full(fd, text, strlen(text), 0);
	if (fd >= 0) {
		if (!r && fsync(fd) < 0)
			r = -errno;
		close(fd);
	}
	free(text);
	return r;
}

/* The layers into work/root, then work/rootfs.ext4. */
static int build(int cachefd, const char *work, const struct image_plan *p,
		 const struct image_source *s, const struct import_opts *o,
		 struct import_result *res, struct logger *log, char *err, size_t errlen)
{
	char path[PATH_MAX + 64];
	snprintf(path, sizeof(path), "%s/root", work);
	if (mkdirat(cachefd, path, 0755) < 0)
		return errmsg(err, errlen, -errno, "cannot make the root: %s", strerror(errno));
	int rootfd = openat(cachefd, path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (rootfd < 0)
		return errmsg(err, errlen, -errno, "cannot open the root: %s", strerror(errno));
	struct unpack_budget b = {.bytes_left = o->max_bytes, .entries_left = MAX_ENTRIES};
	struct unpack_stats st = {0};
	int r = 0;
	for (int i = 0; !r && i < p->nr_layers; i++) {
		const struct plan_layer *pl = &p->layers[i];
		struct layer_src src = {.size = pl->size, .index = i + 1};
		memcpy(src.hex, pl->hex, sizeof(src.hex));
		src.fd = plan_open_beneath(s->dfd, pl->path);
		if (src.fd < 0) {
			r = errmsg(err, errlen, src.fd, "layer %d (%.80s): %s", i + 1, pl->path,
				   src.fd == -EINVAL ? "not a regular file" : strerror(-src.fd));
			break;
		}
		r = unpack_layer(rootfd, &src, &b, &st, log, err, errlen);
		close(src.fd);
	}
	/* cove-init's place: a directory the image does not have (image/README.md). */
	if (!r && mkdirat(rootfd, ".cove", 0755) < 0) {
		struct stat cs;
		if (errno != EEXIST || fstatat(rootfd, ".cove", &cs, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISDIR(cs.st_mode))
			r = errmsg(
			    err, errlen, -EEXIST,
			    "the image has /.cove and it is not a directory: cove-init needs "
			    "that place");
	}
	close(rootfd);
	res->layers = (uint64_t)p->nr_layers;
	res->entries = st.entries;
	res->bytes = st.bytes;
	res->special = st.special;
	if (r)
		return r;
	char real[PATH_MAX], proc[64], root[PATH_MAX + 8], out[PATH_MAX + 16];
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", cachefd);
	if (!realpath(proc, real))
		return errmsg(err, errlen, -errno, "images directory: %s", strerror(errno));
	snprintf(root, sizeof(root), "%s/%s/root", real, work);
	snprintf(out, sizeof(out), "%s/%s/%s", real, work, IMAGE_EXT4);
	uint64_t size = ext4_size_for(st.bytes, st.entries, o->free_bytes);
	r = ext4_build(root, out, size, st.entries, err, errlen);
	res->ext4_bytes = size;
	if (!r)
		log_info(log, "%d layers: %llu entries, %llu MiB of files; ext4 of %llu MiB",
			 p->nr_layers, (unsigned long long)st.entries,
			 (unsigned long long)(st.bytes >> 20), (unsigned long long)(size >> 20));
	return r;
}

int image_import(int cachefd, const struct import_opts *o, struct import_result *res,
		 struct logger *log, char *err, size_t errlen)
{
	memset(res, 0, sizeof(*res));
	uint64_t t0 = now_ms();
	char work[64] = "";
	sweep_work(cachefd, log);
	int r = make_work(cachefd, work, sizeof(work), err, errlen);
	if (r)
		return r;
	int wfd = openat(cachefd, work, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (wfd < 0) {
		r = errmsg(err, errlen, -errno, "work directory: %s", strerror(errno));
		sbx_tree_remove(cachefd, work);
		return r;
	}
	struct image_source s;
	struct image_plan p = {0};
	json_t *cfg = NULL;
	r = source_open(o->source, wfd, o->max_bytes, &s, log, err, errlen);
	if (!r)
		r = plan_read(s.dfd, s.want, &p, err, errlen);
	if (!r)
		r = default_name(o, &p, &s, res->name, sizeof(res->name), err, errlen);
	if (!r)
		r = image_config_take(p.config, &cfg, err, errlen);
	if (!r) {
		memcpy(res->hex, p.key, sizeof(res->hex));
		struct stat st;
		char have[DIGEST_HEX + 32];
		snprintf(have, sizeof(have), "%s/%s", p.key, IMAGE_JSON);
		res->cached = fstatat(cachefd, have, &st, AT_SYMLINK_NOFOLLOW) == 0;
	}
	if (!r && !res->cached) {
		r = build(cachefd, work, &p, &s, o, res, log, err, errlen);
		if (!r)
			r = write_meta(wfd, &p, &s, cfg, res);
		if (!r)
			sbx_tree_remove(wfd, "root");
		source_close(&s);
		if (!r && renameat2(cachefd, work, cachefd, p.key, RENAME_NOREPLACE) < 0 &&
		    errno != EEXIST)
			r = errmsg(err, errlen, -errno, "cannot keep the image: %s",
				   strerror(errno));
		/* EEXIST: another import of the same image finished first; its copy is kept. */
	} else {
		source_close(&s);
	}
	close(wfd);
	sbx_tree_remove(cachefd, work);
	if (!r)
		r = image_ref_set(cachefd, res->name, res->hex, err, errlen);
	json_decref(cfg);
	plan_free(&p);
	res->ms = now_ms() - t0;
	return r;
}
