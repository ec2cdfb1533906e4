/* Layer entry names and the directories beneath the root they lead to (openat2, no links). */
#include "image/rootfs_path.h"

#include "common/errmsg.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

int rootfs_path_clean(const char *in, char *out, size_t cap, char *err, size_t errlen)
{
	if (!in)
		return errmsg(err, errlen, -EINVAL, "an entry without a name");
	if (in[0] == '/')
		return errmsg(err, errlen, -EINVAL, "entry '%.200s' has an absolute path", in);
	size_t o = 0;
	const char *p = in;
	while (*p) {
		while (*p == '/')
			p++;
		const char *e = strchr(p, '/');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		if (n == 0)
			break;
		if (n == 1 && p[0] == '.') {
			p += n;
			continue;
		}
		if (n == 2 && p[0] == '.' && p[1] == '.')
			return errmsg(err, errlen, -EINVAL,
				      "entry '%.200s' climbs out of the root with '..'", in);
		if (n > 255)
			return errmsg(err, errlen, -EINVAL,
				      "entry '%.200s...' has a name longer than 255 bytes", in);
		if (o + (o ? 1 : 0) + n + 1 > cap || o + n + 1 > ROOTFS_PATH_MAX)
			return errmsg(err, errlen, -EINVAL, "entry '%.200s...' has too long a path",
				      in);
		if (o)
			out[o++] = '/';
		memcpy(out + o, p, n);
		o += n;
		p += n;
	}
	if (cap)
		out[o] = '\0';
	return 0;
}

static int open_beneath(int dfd, const char *name)
{
	struct open_how how = {
	    .flags = O_PATH | O_DIRECTORY | O_CLOEXEC, /* a link: -ELOOP (RESOLVE_NO_SYMLINKS) */
	    .resolve =
		RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV,
	};
	long fd = syscall(SYS_openat2, dfd, name, &how, sizeof(how));
	return fd < 0 ? -errno : (int)fd;
}

int rootfs_open_parent(int rootfd, const char *rel, bool create, char *name, size_t cap, char *err,
		       size_t errlen)
{
	int cur = open_beneath(rootfd, ".");
	if (cur < 0)
		return errmsg(err, errlen, cur, "cannot open the root being built: %s",
			      strerror(-cur));
	const char *p = rel;
	for (;;) {
		const char *e = strchr(p, '/');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		if (n + 1 > cap || n > 255) {
			close(cur);
			return errmsg(err, errlen, -ENAMETOOLONG, "'%.200s': name too long", rel);
		}
		memcpy(name, p, n);
		name[n] = '\0';
		if (!e)
			return cur; /* name is the last component ("" for the root) */
		int next = open_beneath(cur, name);
		if (next == -ENOENT && create) {
			if (mkdirat(cur, name, 0755) < 0 && errno != EEXIST) {
				int r = -errno;
				close(cur);
				return errmsg(err, errlen, r,
					      "'%.200s': cannot make a directory: %s", rel,
					      strerror(-r));
			}
			next = open_beneath(cur, name);
		}
		if (next < 0) {
			close(cur);
			if (next == -ELOOP || next == -EXDEV)
				return errmsg(
				    err, errlen, -ELOOP,
				    "entry '%.200s' writes through a symlink ('%.200s' is "
				    "one): refused",
				    rel, name);
			if (next == -ENOTDIR)
				return errmsg(err, errlen, -ENOTDIR,
					      "entry '%.200s': '%.200s' on its path is not a "
					      "directory",
					      rel, name);
			return errmsg(err, errlen, next, "entry '%.200s': %s", rel,
				      strerror(-next));
		}
		close(cur);
		cur = next;
		p = e + 1;
	}
}
