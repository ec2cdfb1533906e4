/* Templates (`cove template`): stopped, read-only sandboxes that new ones are cloned from. */
#ifndef COVE_LIFECYCLE_TEMPLATE_H
#define COVE_LIFECYCLE_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lifecycle/root.h"

/*
 * Templates live in STATE/.templates/T, a sandbox directory like any other (spec, chain, event
 * log, locks), in a root of their own: no sandbox command (ls, exec, start, stop, gc, fork) looks
 * there, so a template is never started, exec'd or changed once saved. While `cove template
 * create` builds one, its sockets are in RUN/.t/T. TPL_META, written last, commits it: a
 * directory without one is a build in progress or one that failed, and nothing clones from it.
 */
#define TPL_DIR	     ".templates"
#define TPL_RUN_DIR  ".t"
#define TPL_META     "template.json"
#define TPL_NAME_MAX 32 /* RUN/.t/NAME/vsock.sock_PORT still fits a sun_path */
#define TPL_RUN_MAX  4096

/* What template.json records (informational: the spec is what a clone runs). */
struct tpl_meta {
	char name[TPL_NAME_MAX + 1];
	int64_t created_ms;
	uint64_t build_ms;     /* boot, setup command, quiet, final snapshot */
	char run[TPL_RUN_MAX]; /* the setup command, "" none */
};

/* [a-z0-9][a-z0-9-]{0,31}: 0, or -EINVAL with one line in err. */
int tpl_name_check(const char *name, char *err, size_t errlen);

/*
 * The templates' root beneath the sandboxes' root `r`: t->state is STATE/.templates (created
 * 0700 when `create`), t->run RUN/.t, t->templates set. 0; -ENOENT (no templates yet, without
 * `create`); -errno with one line in err.
 */
int tpl_root_open(const struct sbx_root *r, struct sbx_root *t, bool create, char *err,
		  size_t errlen);

/* template.json as text (malloc'd) and back: pure, unit-tested. */
char *tpl_meta_format(const struct tpl_meta *m);
int tpl_meta_parse(const char *text, size_t len, struct tpl_meta *m, char *err, size_t errlen);

/* Writes TPL_META beneath dfd (temp file, fsync, rename): the template is saved. 0 or -errno. */
int tpl_meta_write(int dfd, const struct tpl_meta *m);
/* Reads it: 0; -ENOENT when the template is not saved (yet); -errno with one line in err. */
int tpl_meta_read(int dfd, struct tpl_meta *m, char *err, size_t errlen);

#endif
