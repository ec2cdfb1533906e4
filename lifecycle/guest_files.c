/* Finding the default guest kernel and root filesystem image. */
#include "lifecycle/guest_files.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/errmsg.h"

static int is_file(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The newest DIR/KEY/file (by its mtime) into out; 0 or -ENOENT. */
static int newest_in(const char *dir, const char *file, char *out, size_t cap)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	struct timespec best = {0};
	char path[4096];
	struct stat st;
	int found = -ENOENT;

	if (!d)
		return -ENOENT;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		if (snprintf(path, sizeof(path), "%s/%s/%s", dir, e->d_name, file) >=
		    (int)sizeof(path))
			continue;
		if (stat(path, &st) < 0 || !S_ISREG(st.st_mode))
			continue;
		if (found == 0 &&
		    (st.st_mtim.tv_sec < best.tv_sec ||
		     (st.st_mtim.tv_sec == best.tv_sec && st.st_mtim.tv_nsec <= best.tv_nsec)))
			continue;
		if ((size_t)snprintf(out, cap, "%s", path) >= cap)
			continue;
		best = st.st_mtim;
		found = 0;
	}
	closedir(d);
	return found;
}

/*
 * A fixed layout under base: base/kernel/bzImage and base/rootfs/rootfs.ext4 (the busybox root);
 * with debian, base/image/rootfs.ext4 (the Debian root guest/image/build makes) is preferred.
 */
static int try_layout(const char *base, bool debian, char *k, char *r, size_t cap)
{
	char kp[4096], rp[4096];

	snprintf(kp, sizeof(kp), "%s/kernel/bzImage", base);
	snprintf(rp, sizeof(rp), "%s/image/rootfs.ext4", base);
	if (!debian || !is_file(rp))
		snprintf(rp, sizeof(rp), "%s/rootfs/rootfs.ext4", base);
	if (!is_file(kp) || !is_file(rp) || strlen(kp) >= cap || strlen(rp) >= cap)
		return -ENOENT;
	strcpy(k, kp);
	strcpy(r, rp);
	return 0;
}

static int try_cache(char *k, char *r, size_t cap)
{
	const char *env = getenv("COVE_CACHE"), *home = getenv("HOME");
	char base[4096], dir[4200];

	if (env && *env)
		snprintf(base, sizeof(base), "%s", env);
	else if (home && *home)
		snprintf(base, sizeof(base), "%s/.cache/cove", home);
	else
		return -ENOENT;
	snprintf(dir, sizeof(dir), "%s/kernel", base);
	if (newest_in(dir, "bzImage", k, cap))
		return -ENOENT;
	/* The Debian image when one was built (guest/image/build), else the busybox root. */
	snprintf(dir, sizeof(dir), "%s/image", base);
	if (newest_in(dir, "rootfs.ext4", r, cap) == 0)
		return 0;
	snprintf(dir, sizeof(dir), "%s/rootfs", base);
	return newest_in(dir, "rootfs.ext4", r, cap);
}

int sbx_guest_find(char *kernel, char *rootfs, size_t cap, char *err, size_t errlen)
{
	const char *gd = getenv("COVE_GUEST_DIR");
	char k[4096] = "", r[4096] = "";

	/* $COVE_GUEST_DIR pins its own layout: kernel/ and rootfs/ (tests pin the busybox root). */
	if (!((gd && *gd && !try_layout(gd, false, k, r, sizeof(k))) ||
	      !try_cache(k, r, sizeof(k)) || !try_layout("/usr/share/cove", true, k, r, sizeof(k))))
		return errmsg(
		    err, errlen, -ENOENT,
		    "no guest kernel and root image found ($COVE_GUEST_DIR, the build "
		    "cache, /usr/share/cove): run guest/kernel/build and guest/image/build (or "
		    "guest/rootfs/build), "
		    "or give --kernel and --rootfs");
	if (!kernel[0])
		snprintf(kernel, cap, "%s", k);
	if (!rootfs[0])
		snprintf(rootfs, cap, "%s", r);
	return 0;
}
