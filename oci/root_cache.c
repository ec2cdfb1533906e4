/* cove-oci's root disks in the image cache: use marks, least-recently-used trim
 * (oci/root_cache.h). */
#include "oci/root_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/errmsg.h"
#include "image/cache.h"

struct root_use {
	const char *name, *hex;
	struct timespec used;
};

void oci_root_entry_remove(int cachefd, const char *name)
{
	int dfd = openat(cachefd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd >= 0) {
		unlinkat(dfd, IMAGE_EXT4, 0);
		unlinkat(dfd, IMAGE_JSON, 0);
		close(dfd);
	}
	unlinkat(cachefd, name, AT_REMOVEDIR);
}

void oci_root_touch(int cachefd, const char *hex)
{
	utimensat(cachefd, hex, NULL, AT_SYMLINK_NOFOLLOW);
}

static int older_first(const void *a, const void *b)
{
	const struct root_use *x = a, *y = b;
	if (x->used.tv_sec != y->used.tv_sec)
		return x->used.tv_sec < y->used.tv_sec ? -1 : 1;
	if (x->used.tv_nsec != y->used.tv_nsec)
		return x->used.tv_nsec < y->used.tv_nsec ? -1 : 1;
	return strcmp(x->hex, y->hex);
}

int oci_root_trim(int cachefd, size_t keep, const char *spare, char *err, size_t errlen)
{
	json_t *refs, *v;
	const char *name;
	size_t n = 0, removed = 0;
	int r = image_refs_read(cachefd, &refs, err, errlen);
	if (r)
		return r;
	struct root_use *u = calloc(json_object_size(refs) + 1, sizeof(*u));
	if (!u) {
		json_decref(refs);
		return -ENOMEM;
	}
	json_object_foreach(refs, name, v)
	{
		const char *hex = json_string_value(v);
		struct stat st;
		if (strncmp(name, OCI_ROOT_REF, strlen(OCI_ROOT_REF)) || !hex)
			continue;
		/* An entry gone meanwhile sorts first: its name is removed. */
		u[n] = (struct root_use){.name = name, .hex = hex};
		if (fstatat(cachefd, hex, &st, AT_SYMLINK_NOFOLLOW) == 0)
			u[n].used = st.st_mtim;
		n++;
	}
	qsort(u, n, sizeof(*u), older_first);
	for (size_t i = 0; i < n && n - removed > keep; i++) {
		if (spare && !strcmp(u[i].hex, spare))
			continue;
		r = image_ref_set(cachefd, u[i].name, NULL, err, errlen);
		if (r)
			break;
		oci_root_entry_remove(cachefd, u[i].hex);
		removed++;
	}
	free(u);
	json_decref(refs);
	return r ? r : (int)removed;
}
