/* The record of memory layers still arriving from the store (lazy_files.h). */
#include "lifecycle/lazy_files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "common/file_io.h"
#include "lifecycle/root.h"

#define LAZY_JSON_MAX (64u * 1024)

static int parse_file(json_t *e, struct sbx_lazy_file *f)
{
	const char *name = json_string_value(json_object_get(e, "name"));
	const char *hex = json_string_value(json_object_get(e, "sha256"));
	json_t *size = json_object_get(e, "size");
	if (!name || !hex || !json_is_integer(size) || json_integer_value(size) < 0 ||
	    strlen(name) >= sizeof(f->name) || !dirfd_plain_name(name) ||
	    json_object_size(e) != 3 || digest_unhex(hex, f->digest))
		return -EINVAL;
	snprintf(f->name, sizeof(f->name), "%s", name);
	f->size = (uint64_t)json_integer_value(size);
	return 0;
}

int sbx_lazy_load(int dfd, struct sbx_lazy *l, char *err, size_t errlen)
{
	memset(l, 0, sizeof(*l));
	int fd = dirfd_open(dfd, SBX_LAZY_FILE, O_RDONLY);
	if (fd == -ENOENT)
		return -ENOENT;
	if (fd < 0)
		return errmsg(err, errlen, fd, SBX_LAZY_FILE ": %s", strerror(-fd));
	char *buf = malloc(LAZY_JSON_MAX + 1);
	ssize_t n = buf ? read(fd, buf, LAZY_JSON_MAX + 1) : -1;
	close(fd);
	if (n < 0 || n > LAZY_JSON_MAX) {
		free(buf);
		return errmsg(err, errlen, n > 0 ? -EFBIG : -EIO,
			      SBX_LAZY_FILE ": unreadable or over %u bytes", LAZY_JSON_MAX);
	}
	json_error_t je;
	json_t *o = json_loadb(buf, (size_t)n, JSON_REJECT_DUPLICATES, &je);
	free(buf);
	json_t *gen = json_object_get(o, "generation"), *files = json_object_get(o, "files");
	int r = json_is_integer(gen) && json_integer_value(gen) >= 0 && json_is_array(files) &&
			json_array_size(files) <= SBX_LAZY_MAX_FILES
		    ? 0
		    : -EINVAL;
	size_t i;
	json_t *e;
	if (!r) {
		l->generation = (uint64_t)json_integer_value(gen);
		json_array_foreach(files, i, e)
		{
			r = parse_file(e, &l->f[l->n]);
			if (r)
				break;
			l->n++;
		}
	}
	json_decref(o);
	if (r)
		return errmsg(err, errlen, r, SBX_LAZY_FILE ": malformed");
	return 0;
}

int sbx_lazy_save(int dfd, const struct sbx_lazy *l)
{
	json_t *files = json_array();
	for (size_t i = 0; files && i < l->n; i++) {
		char hex[DIGEST_HEX_LEN];
		digest_hex(l->f[i].digest, hex);
		json_array_append_new(files,
				      json_pack("{s:s,s:I,s:s}", "name", l->f[i].name, "size",
						(json_int_t)l->f[i].size, "sha256", hex));
	}
	json_t *o = json_pack("{s:I,s:o}", "generation", (json_int_t)l->generation, "files", files);
	char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	if (!text)
		return -ENOMEM;
	char tmp[96];
	int fd = dirfd_create_tmp(dfd, SBX_LAZY_FILE, tmp, sizeof(tmp), O_WRONLY, 0600);
	int r = fd < 0 ? fd : pwrite_full(fd, text, strlen(text), 0);
	if (!r && fsync(fd) < 0)
		r = -errno;
	if (fd >= 0)
		close(fd);
	if (!r)
		r = dirfd_rename(dfd, tmp, SBX_LAZY_FILE);
	else if (fd >= 0)
		dirfd_unlink(dfd, tmp);
	free(text);
	return r;
}

int sbx_lazy_pending(int dfd)
{
	return faccessat(dfd, SBX_LAZY_FILE, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
}

int sbx_lazy_pending_at(const struct sbx_root *r, const char *name)
{
	int dfd = openat(r->dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0)
		return 0;
	int p = sbx_lazy_pending(dfd);
	close(dfd);
	return p;
}
