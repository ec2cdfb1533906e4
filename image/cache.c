/* The host's imported images (image/cache.h). */
#include "image/cache.h"

#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "common/file_io.h"
#include "lifecycle/lock.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define REFS_MAX   (1 << 20)
#define CACHE_LOCK ".lock"

bool image_name_ok(const char *name)
{
	size_t n = name ? strlen(name) : 0;
	if (n == 0 || n > IMAGE_NAME_MAX || strstr(name, ".."))
		return false;
	if (!((name[0] >= 'a' && name[0] <= 'z') || (name[0] >= 'A' && name[0] <= 'Z') ||
	      (name[0] >= '0' && name[0] <= '9')))
		return false;
	for (const char *c = name; *c; c++)
		if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
		      (*c >= '0' && *c <= '9') || strchr("._/:@-", *c)))
			return false;
	return true;
}

int image_cache_open(int statefd, bool create, char *err, size_t errlen)
{
	if (create && mkdirat(statefd, IMAGES_DIR, 0700) < 0 && errno != EEXIST)
		return errmsg(err, errlen, -errno, "cannot make %s: %s", IMAGES_DIR,
			      strerror(errno));
	int fd = openat(statefd, IMAGES_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errmsg(err, errlen, -errno,
			      errno == ENOENT ? "no images imported yet" : "%s: %s", IMAGES_DIR,
			      strerror(errno));
	return fd;
}

static int refs_load(int cachefd, json_t **out, char *err, size_t errlen)
{
	int fd = dirfd_open(cachefd, IMAGE_REFS, O_RDONLY | O_CLOEXEC);
	if (fd == -ENOENT) {
		*out = json_object();
		return *out ? 0 : -ENOMEM;
	}
	if (fd < 0)
		return errmsg(err, errlen, fd, "%s: %s", IMAGE_REFS, strerror(-fd));
	json_error_t je;
	json_t *j = json_loadfd(fd, JSON_REJECT_DUPLICATES, &je);
	struct stat s;
	int big = fstat(fd, &s) == 0 && s.st_size > REFS_MAX;
	close(fd);
	json_t *refs = j ? json_object_get(j, "refs") : NULL;
	if (!j || big || !json_is_object(refs)) {
		json_decref(j);
		return errmsg(err, errlen, -EINVAL, "%s: not a list of images this cove wrote",
			      IMAGE_REFS);
	}
	*out = json_incref(refs);
	json_decref(j);
	return 0;
}

int image_refs_read(int cachefd, json_t **out, char *err, size_t errlen)
{
	int lk = sbx_lock_take(cachefd, CACHE_LOCK, true, false);
	if (lk < 0)
		return errmsg(err, errlen, lk, "images: cannot take the lock: %s", strerror(-lk));
	int r = refs_load(cachefd, out, err, errlen);
	close(lk);
	return r;
}

int image_ref_set(int cachefd, const char *name, const char *hex, char *err, size_t errlen)
{
	int lk = sbx_lock_take(cachefd, CACHE_LOCK, true, false);
	if (lk < 0)
		return errmsg(err, errlen, lk, "images: cannot take the lock: %s", strerror(-lk));
	json_t *refs;
	int r = refs_load(cachefd, &refs, err, errlen);
	if (!r) {
		if (hex)
			json_object_set_new(refs, name, json_string(hex));
		else
			json_object_del(refs, name);
		json_t *j = json_pack("{s:i,s:O}", "version", 1, "refs", refs);
		char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
		json_decref(j);
		json_decref(refs);
		int fd =
		    text ? dirfd_create(cachefd, "." IMAGE_REFS ".tmp", O_WRONLY | O_CLOEXEC, 0600)
			 : -ENOMEM;
		r = fd < 0 ? fd : pwrite_full(fd, text, strlen(text), 0);
		if (fd >= 0) {
			if (!r && fsync(fd) < 0)
				r = -errno;
			close(fd);
		}
		free(text);
		if (!r)
			r = dirfd_rename(cachefd, "." IMAGE_REFS ".tmp", IMAGE_REFS);
		if (r)
			errmsg(err, errlen, r, "cannot write %s: %s", IMAGE_REFS, strerror(-r));
	}
	close(lk);
	return r;
}

static bool hex_prefix(const char *s)
{
	size_t n = strlen(s);
	if (n < 12 || n > DIGEST_HEX)
		return false;
	for (const char *c = s; *c; c++)
		if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f')))
			return false;
	return true;
}

int image_resolve(int cachefd, const char *ref, char hex[DIGEST_HEX + 1], char *err, size_t errlen)
{
	if (ref && digest_parse(ref, hex) == 0)
		return faccessat(cachefd, hex, F_OK, AT_SYMLINK_NOFOLLOW) == 0
			   ? 0
			   : errmsg(err, errlen, -ENOENT, "no image %.80s here", ref);
	json_t *refs;
	int r = image_refs_read(cachefd, &refs, err, errlen);
	if (r)
		return r;
	const char *h = json_string_value(json_object_get(refs, ref));
	if (h && strlen(h) == DIGEST_HEX) {
		memcpy(hex, h, DIGEST_HEX + 1);
		json_decref(refs);
		return 0;
	}
	json_decref(refs);
	if (!hex_prefix(ref))
		return errmsg(err, errlen, -ENOENT, "no image named %.200s (cove image ls)", ref);
	int fd = openat(cachefd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd < 0 ? NULL : fdopendir(fd);
	if (!d) {
		if (fd >= 0)
			close(fd);
		return errmsg(err, errlen, -EIO, "cannot list the images");
	}
	int found = 0;
	struct dirent *de;
	while ((de = readdir(d)))
		if (strlen(de->d_name) == DIGEST_HEX && !strncmp(de->d_name, ref, strlen(ref))) {
			memcpy(hex, de->d_name, DIGEST_HEX + 1);
			found++;
		}
	closedir(d);
	if (found == 1)
		return 0;
	if (found)
		return errmsg(err, errlen, -EINVAL, "%.64s names %d images: give more digits", ref,
			      found);
	return errmsg(err, errlen, -ENOENT, "no image %.64s here", ref);
}

int image_meta_read(int cachefd, const char *hex, json_t **out, char *err, size_t errlen)
{
	char path[DIGEST_HEX + 32];
	snprintf(path, sizeof(path), "%s/%s", hex, IMAGE_JSON);
	int fd = openat(cachefd, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errmsg(err, errlen, -errno, "image %.12s: %s", hex, strerror(errno));
	json_error_t je;
	json_t *j = json_loadfd(fd, JSON_REJECT_DUPLICATES, &je);
	close(fd);
	if (!json_is_object(j) || json_integer_value(json_object_get(j, "version")) != 1) {
		json_decref(j);
		return errmsg(err, errlen, -EINVAL, "image %.12s: %s is not one this cove wrote",
			      hex, IMAGE_JSON);
	}
	*out = j;
	return 0;
}
