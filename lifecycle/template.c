/* Templates: their names, their root beneath the state root, and template.json. */
#include "lifecycle/template.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "common/file_io.h"
#include "lifecycle/name.h"

#define TPL_META_MAX (64 * 1024)

int tpl_name_check(const char *name, char *err, size_t errlen)
{
	size_t n = name ? strnlen(name, TPL_NAME_MAX + 1) : 0;

	if (n == 0)
		return errmsg(err, errlen, -EINVAL, "a template name is required");
	if (n > TPL_NAME_MAX)
		return errmsg(err, errlen, -EINVAL,
			      "template name too long (at most %d characters: [a-z0-9][a-z0-9-]*)",
			      TPL_NAME_MAX);
	/* The sandbox rule, shorter: the same characters, so every path built from it fits. */
	if (sbx_name_check(name, NULL, 0))
		return errmsg(err, errlen, -EINVAL,
			      "bad template name '%.*s' (names are [a-z0-9][a-z0-9-]*, at most %d "
			      "characters)",
			      TPL_NAME_MAX, name, TPL_NAME_MAX);
	return 0;
}

int tpl_root_open(const struct sbx_root *r, struct sbx_root *t, bool create, char *err,
		  size_t errlen)
{
	int fd;

	t->dfd = -1;
	t->templates = true;
	if ((size_t)snprintf(t->state, sizeof(t->state), "%s/%s", r->state, TPL_DIR) >=
		sizeof(t->state) ||
	    (size_t)snprintf(t->run, sizeof(t->run), "%s/%s", r->run, TPL_RUN_DIR) >=
		sizeof(t->run))
		return errmsg(err, errlen, -ENAMETOOLONG, "the state or runtime path is too long");
	if (create && mkdirat(r->dfd, TPL_DIR, 0700) < 0 && errno != EEXIST)
		return errmsg(err, errlen, -errno, "%s: %s", t->state, strerror(errno));
	fd = openat(r->dfd, TPL_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errmsg(err, errlen, -errno, errno == ENOENT ? "no templates yet" : "%s: %s",
			      t->state, strerror(errno));
	t->dfd = fd;
	return 0;
}

char *tpl_meta_format(const struct tpl_meta *m)
{
	json_t *j = json_pack("{s:i,s:s,s:I,s:I,s:s}", "version", 1, "name", m->name, "created_ms",
			      (json_int_t)m->created_ms, "build_ms", (json_int_t)m->build_ms, "run",
			      m->run);
	char *text = j ? json_dumps(j, JSON_INDENT(2)) : NULL;

	json_decref(j);
	return text;
}

int tpl_meta_parse(const char *text, size_t len, struct tpl_meta *m, char *err, size_t errlen)
{
	json_error_t je;
	json_t *j = json_loadb(text, len, 0, &je), *c, *b;
	const char *name, *run;
	int ret = 0;

	if (!j)
		return errmsg(err, errlen, -EINVAL, "%s: line %d: %s", TPL_META, je.line, je.text);
	memset(m, 0, sizeof(*m));
	name = json_string_value(json_object_get(j, "name"));
	run = json_string_value(json_object_get(j, "run"));
	c = json_object_get(j, "created_ms");
	b = json_object_get(j, "build_ms");
	if (json_integer_value(json_object_get(j, "version")) != 1 || !name ||
	    tpl_name_check(name, NULL, 0) || !run || strlen(run) >= sizeof(m->run) ||
	    !json_is_integer(c) || json_integer_value(c) < 0 || !json_is_integer(b) ||
	    json_integer_value(b) < 0)
		ret = errmsg(err, errlen, -EINVAL, "%s: not a template record this cove wrote",
			     TPL_META);
	else {
		snprintf(m->name, sizeof(m->name), "%s", name);
		snprintf(m->run, sizeof(m->run), "%s", run);
		m->created_ms = (int64_t)json_integer_value(c);
		m->build_ms = (uint64_t)json_integer_value(b);
	}
	json_decref(j);
	return ret;
}

int tpl_meta_write(int dfd, const struct tpl_meta *m)
{
	char *text = tpl_meta_format(m);
	int fd, ret;

	if (!text)
		return -ENOMEM;
	fd = dirfd_create(dfd, "." TPL_META ".tmp", O_WRONLY | O_CLOEXEC, 0600);
	if (fd < 0) {
		free(text);
		return fd;
	}
	ret = pwrite_full(fd, text, strlen(text), 0);
	if (!ret && fsync(fd) < 0)
		ret = -errno;
	close(fd);
	free(text);
	return ret ?: dirfd_rename(dfd, "." TPL_META ".tmp", TPL_META) ?: dirfd_sync(dfd);
}

int tpl_meta_read(int dfd, struct tpl_meta *m, char *err, size_t errlen)
{
	int fd = dirfd_open(dfd, TPL_META, O_RDONLY | O_CLOEXEC), ret;
	struct stat st;
	char *buf;

	if (fd == -ENOENT)
		return errmsg(err, errlen, -ENOENT,
			      "the template is not saved (a build is under "
			      "way, or one failed)");
	if (fd < 0)
		return errmsg(err, errlen, fd, "%s: %s", TPL_META, strerror(-fd));
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
	    st.st_size > TPL_META_MAX) {
		close(fd);
		return errmsg(err, errlen, -EINVAL, "%s: empty or too large", TPL_META);
	}
	buf = malloc((size_t)st.st_size);
	ret = buf ? pread_full(fd, buf, (size_t)st.st_size, 0) : -ENOMEM;
	close(fd);
	if (!ret)
		ret = tpl_meta_parse(buf, (size_t)st.st_size, m, err, errlen);
	else
		errmsg(err, errlen, ret, "%s: %s", TPL_META, strerror(-ret));
	free(buf);
	return ret;
}
