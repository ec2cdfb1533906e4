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

int passwd_lookup(const char *user, struct pw_ent *out)
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
