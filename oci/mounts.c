/* config.json's mounts and devices (oci/bundle.h oci_mounts_plan). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/errmsg.h"
#include "oci/bundle.h"

/* The guest mounts these itself (cove-init): what the engine asks for there is the guest's. */
static const char *const guest_own[] = {"/proc",       "/dev",	   "/sys",	    "/dev/pts",
					"/dev/mqueue", "/dev/shm", "/sys/fs/cgroup"};
/* Small files engines bind in: copied into the guest before the process runs. */
static const char *const copied[] = {"/etc/hosts", "/etc/hostname", "/etc/resolv.conf",
				     "/run/.containerenv", "/dev/termination-log"};

static bool listed(const char *const *l, size_t n, const char *p)
{
	for (size_t i = 0; i < n; i++)
		if (!strcmp(l[i], p))
			return true;
	return false;
}

/* An absolute guest path without "." or ".." components and without a trailing slash. */
static bool dest_ok(const char *d)
{
	if (!d || d[0] != '/' || strlen(d) >= PATH_MAX)
		return false;
	for (const char *c = d; *c;) {
		const char *e = strchr(c + 1, '/');
		size_t n = e ? (size_t)(e - c - 1) : strlen(c + 1);
		if ((n == 1 && c[1] == '.') || (n == 2 && c[1] == '.' && c[2] == '.') ||
		    (n == 0 && (e || c != d)))
			return false;
		if (!e)
			break;
		c = e;
	}
	return true;
}

static bool has_option(json_t *opts, const char *o)
{
	size_t i;
	json_t *v;
	json_array_foreach(opts, i, v) if (json_is_string(v) &&
					   !strcmp(json_string_value(v), o)) return true;
	return false;
}

/* A copy-in's source: a regular host file of at most OCI_COPY_MAX bytes, not a symlink. */
static int copy_source_ok(const char *src, const char *dest, char *err, size_t errlen)
{
	struct stat st;
	if (!src || src[0] != '/' || strlen(src) >= PATH_MAX)
		return errmsg(err, errlen, -EINVAL, "mount %s: its source is not an absolute path",
			      dest);
	if (lstat(src, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > OCI_COPY_MAX)
		return errmsg(err, errlen, -EINVAL,
			      "mount %s: its source %.200s is not a regular file of at most %d "
			      "bytes",
			      dest, src, OCI_COPY_MAX);
	return 0;
}

int oci_mounts_plan(json_t *config, struct oci_bundle *b, char *err, size_t errlen)
{
	json_t *mounts = json_object_get(config, "mounts"), *m;
	json_t *devs = json_object_get(json_object_get(config, "linux"), "devices");
	size_t i;

	if (devs && (!json_is_array(devs) || json_array_size(devs))) {
		const char *p = json_string_value(json_object_get(json_array_get(devs, 0), "path"));
		return errmsg(err, errlen, -EINVAL,
			      "device %.200s: a VM cannot be given the host's devices",
			      p ? p : "(not an array)");
	}
	if (!mounts)
		return 0;
	if (!json_is_array(mounts) || json_array_size(mounts) > OCI_MOUNTS_MAX)
		return errmsg(err, errlen, -EINVAL, "mounts: not an array of at most %d",
			      OCI_MOUNTS_MAX);
	b->mounts = calloc(json_array_size(mounts) + 1, sizeof(*b->mounts));
	if (!b->mounts)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	json_array_foreach(mounts, i, m)
	{
		const char *dest = json_string_value(json_object_get(m, "destination"));
		const char *type = json_string_value(json_object_get(m, "type"));
		const char *src = json_string_value(json_object_get(m, "source"));
		json_t *opts = json_object_get(m, "options");
		if (!json_is_object(m) || !dest_ok(dest))
			return errmsg(err, errlen, -EINVAL,
				      "mounts[%zu]: the destination is not a clean absolute path",
				      i);
		if (opts && !json_is_array(opts))
			return errmsg(err, errlen, -EINVAL, "mount %s: options is not an array",
				      dest);
		bool bind = (type && !strcmp(type, "bind")) || has_option(opts, "bind") ||
			    has_option(opts, "rbind");
		if (listed(guest_own, sizeof(guest_own) / sizeof(*guest_own), dest) && !bind)
			continue;
		struct oci_mount *o = &b->mounts[b->nmounts];
		if (bind && listed(copied, sizeof(copied) / sizeof(*copied), dest)) {
			int r = copy_source_ok(src, dest, err, errlen);
			if (r)
				return r;
			strcpy(o->dest, dest);
			strcpy(o->source, src);
			o->copy = true;
			b->nmounts++;
			continue;
		}
		if (bind && !strcmp(dest, "/dev/shm"))
			continue; /* a pod's shared /dev/shm: the guest has its own */
		if (bind)
			return errmsg(err, errlen, -EINVAL,
				      "mount %s: a bind mount of the host's %.200s; a VM without "
				      "shared folders cannot honour it",
				      dest, src ? src : "?");
		if (!type || strcmp(type, "tmpfs"))
			return errmsg(
			    err, errlen, -EINVAL,
			    "mount %s: type %.40s is not one the guest can give (tmpfs, and "
			    "its own /proc, /dev, /sys)",
			    dest, type ? type : "(none)");
		strcpy(o->dest, dest);
		json_t *v;
		size_t k;
		json_array_foreach(opts, k, v)
		{
			const char *opt = json_string_value(v);
			if (opt && !strncmp(opt, "size=", 5) && strlen(opt + 5) < sizeof(o->size))
				strcpy(o->size, opt + 5);
		}
		b->nmounts++;
	}
	return 0;
}
