/* passwd.c: finds a user in /etc/passwd by name or numeric uid (no NSS in a static binary). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"
#include "common/fd_io.h"

#define PASSWD_MAX (1u << 20)

static int copy_field(char *dst, size_t cap, const char *s, size_t n)
{
	if (n >= cap)
		return -ENAMETOOLONG;
	memcpy(dst, s, n);
	dst[n] = '\0';
	return 0;
}

static int parse_id(const char *s, size_t n, unsigned long *out)
{
	unsigned long v = 0;

	if (n == 0 || n > 10)
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -EINVAL;
		v = v * 10 + (unsigned long)(s[i] - '0');
	}
	if (v > 0xfffffffeul)
		return -EINVAL;
	*out = v;
	return 0;
}

/*
 * One "name:pw:uid:gid:gecos:home:shell" line per entry. user is a name, or digits for a uid; a
 * uid with no entry still works (gid = uid, home /), as in su-exec and docker.
 */
int passwd_find(const char *buf, size_t len, const char *user, struct pw_ent *out)
{
	size_t ulen = strlen(user), pos = 0;
	unsigned long want_uid = 0;
	int by_uid = parse_id(user, ulen, &want_uid) == 0;

	while (pos < len) {
		const char *line = buf + pos, *end = memchr(line, '\n', len - pos);
		const char *f[7];
		size_t fl[7], n = end ? (size_t)(end - line) : len - pos, nf = 0, start = 0;
		unsigned long uid, gid;

		pos += n + (end ? 1 : 0);
		for (size_t i = 0; i <= n && nf < 7; i++) {
			if (i == n || line[i] == ':') {
				f[nf] = line + start;
				fl[nf++] = i - start;
				start = i + 1;
			}
		}
		if (nf != 7 || parse_id(f[2], fl[2], &uid) < 0 || parse_id(f[3], fl[3], &gid) < 0)
			continue;
		if (by_uid ? uid != want_uid : (fl[0] != ulen || memcmp(f[0], user, ulen) != 0))
			continue;
		out->uid = (uid_t)uid;
		out->gid = (gid_t)gid;
		if (copy_field(out->name, sizeof(out->name), f[0], fl[0]) < 0 ||
		    copy_field(out->home, sizeof(out->home), f[5], fl[5]) < 0 ||
		    copy_field(out->shell, sizeof(out->shell), f[6], fl[6]) < 0)
			return -ENAMETOOLONG;
		return 0;
	}
	if (!by_uid)
		return -ENOENT;
	out->uid = (uid_t)want_uid;
	out->gid = (gid_t)want_uid;
	snprintf(out->name, sizeof(out->name), "%lu", want_uid);
	strcpy(out->home, "/");
	strcpy(out->shell, "/bin/sh");
	return 0;
}

/* A group's gid from /etc/group ("name:pw:gid:members"), or digits. */
static int group_find(const char *buf, size_t len, const char *group, gid_t *out)
{
	size_t glen = strlen(group), pos = 0;
	unsigned long gid;

	if (parse_id(group, glen, &gid) == 0) {
		*out = (gid_t)gid;
		return 0;
	}
	while (pos < len) {
		const char *line = buf + pos, *end = memchr(line, '\n', len - pos);
		size_t n = end ? (size_t)(end - line) : len - pos;
		const char *c1 = memchr(line, ':', n), *c2, *c3;

		pos += n + (end ? 1 : 0);
		if (!c1 || (size_t)(c1 - line) != glen || memcmp(line, group, glen))
			continue;
		c2 = memchr(c1 + 1, ':', (size_t)(line + n - c1 - 1));
		c3 = c2 ? memchr(c2 + 1, ':', (size_t)(line + n - c2 - 1)) : NULL;
		if (c2 && c3 && parse_id(c2 + 1, (size_t)(c3 - c2 - 1), &gid) == 0) {
			*out = (gid_t)gid;
			return 0;
		}
	}
	return -ENOENT;
}

static int read_etc(const char *path, char *buf, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t r;

	if (fd < 0)
		return 0;
	r = read_upto(fd, buf, cap);
	close(fd);
	return r > 0 ? (int)r : 0;
}

static int passwd_lookup_one(const char *user, struct pw_ent *out);

/* USER, or USER:GROUP as an image's config writes it (each a name or a number). */
int passwd_lookup(const char *user, struct pw_ent *out)
{
	const char *colon = strchr(user, ':');
	char name[64];
	char *buf;
	int ret, len;
	gid_t gid;

	if (!colon)
		return passwd_lookup_one(user, out);
	if ((size_t)(colon - user) >= sizeof(name) || colon == user || !colon[1])
		return -EINVAL;
	memcpy(name, user, (size_t)(colon - user));
	name[colon - user] = '\0';
	ret = passwd_lookup_one(name, out);
	if (ret < 0)
		return ret;
	buf = malloc(PASSWD_MAX);
	if (!buf)
		return -ENOMEM;
	len = read_etc("/etc/group", buf, PASSWD_MAX);
	ret = group_find(buf, (size_t)len, colon + 1, &gid);
	free(buf);
	if (ret == 0)
		out->gid = gid;
	return ret;
}

static int passwd_lookup_one(const char *user, struct pw_ent *out)
{
	int fd = open("/etc/passwd", O_RDONLY | O_CLOEXEC);
	char *buf;
	size_t len = 0;
	int ret;

	buf = malloc(PASSWD_MAX);
	if (!buf) {
		if (fd >= 0)
			close(fd);
		return -ENOMEM;
	}
	if (fd >= 0) {
		ssize_t r = read_upto(fd, buf, PASSWD_MAX);

		len = r > 0 ? (size_t)r : 0;
		close(fd);
	}
	ret = passwd_find(buf, len, user, out);
	free(buf);
	return ret;
}
