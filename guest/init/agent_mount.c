/* {"op":"mount","type":"tmpfs","target":"/abs","size":"64m"} -> {"ok":true}: a tmpfs at a path
 * a container's config.json names (cove-oci), made before its process runs. Only tmpfs: the
 * guest has no other file system to give, and the host's never reach it. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include "agent.h"

/* An absolute path without "." or ".." components. */
static int target_ok(const char *t)
{
	if (!t || t[0] != '/' || strlen(t) >= 4096)
		return 0;
	for (const char *c = t; (c = strchr(c, '/'));) {
		c++;
		if ((c[0] == '.' && (c[1] == '/' || !c[1])) ||
		    (c[0] == '.' && c[1] == '.' && (c[2] == '/' || !c[2])))
			return 0;
	}
	return 1;
}

/* Digits and at most one of k, m, g or %: tmpfs's own size= forms. */
static int size_ok(const char *s)
{
	size_t n = strspn(s, "0123456789");
	return n > 0 && n < 20 && (!s[n] || (strchr("kmgKMG%", s[n]) && !s[n + 1]));
}

/* mkdir -p, 0755, as root (the agent's own identity). */
static int make_dirs(char *p)
{
	for (char *c = p + 1;; c++) {
		if (*c != '/' && *c)
			continue;
		char keep = *c;
		*c = '\0';
		int r = mkdir(p, 0755) < 0 && errno != EEXIST ? -errno : 0;
		*c = keep;
		if (r || !keep)
			return r;
	}
}

int mount_handle(int fd, json_t *msg)
{
	const char *type = json_string_value(json_object_get(msg, "type"));
	const char *target = json_string_value(json_object_get(msg, "target"));
	const char *size = json_string_value(json_object_get(msg, "size"));
	char path[4096], opts[64];

	if (!type || strcmp(type, "tmpfs"))
		return wire_reply_error(fd, "mount: only tmpfs");
	if (!target_ok(target))
		return wire_reply_error(fd, "mount: target is not a clean absolute path");
	if (size && size[0] && !size_ok(size))
		return wire_reply_error(fd, "mount: bad size");
	strcpy(path, target);
	int r = make_dirs(path);
	if (r)
		return wire_reply_error(fd, "mount %s: mkdir: %s", target, strerror(-r));
	snprintf(opts, sizeof(opts), "mode=1777%s%s", size && size[0] ? ",size=" : "",
		 size && size[0] ? size : "");
	if (mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0)
		return wire_reply_error(fd, "mount %s: %s", target, strerror(errno));
	json_t *j = json_pack("{s:b}", "ok", 1);
	r = j ? wire_msg_write(fd, j) : -ENOMEM;
	json_decref(j);
	return r;
}
