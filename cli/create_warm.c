/* The warm default `cove create NAME`: a restore of the implicit template of its configuration,
 * built by the first create that needs it. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/create_from.h"
#include "cli/sandbox_stop.h"
#include "cli/template_build.h"
#include "lifecycle/launch.h"
#include "lifecycle/lock.h"
#include "lifecycle/root.h"
#include "lifecycle/template.h"
#include "lifecycle/tree.h"
#include "lifecycle/warm.h"

#define WHO "cove create"

/* The implicit template's name for s, from its key text: 0, or -errno with the reason in err. */
static int key_name(const struct sbx_spec *s, char *name, size_t cap, char *err, size_t errlen)
{
	char vmm[4096], *key = malloc(WARM_KEY_MAX);
	int ret = key ? sbx_vmm_exe(vmm, sizeof(vmm)) : -ENOMEM;

	if (ret == -ENOMEM)
		snprintf(err, errlen, "out of memory");
	else if (ret)
		snprintf(err, errlen, "cove-vmm: %s", strerror(-ret));
	else if (!(ret = warm_key_text(s, vmm, key, WARM_KEY_MAX, err, errlen)) &&
		 (ret = warm_name_of(key, name, cap)))
		snprintf(err, errlen, "SHA-256 failed");
	free(key);
	return ret;
}

/* The same, with one line on stderr when it fails. */
static int warm_name(const struct sbx_spec *s, char *name, size_t cap)
{
	char err[512] = "";
	int ret = key_name(s, name, cap, err, sizeof(err));

	if (ret)
		fprintf(stderr, WHO ": the implicit template's key: %s\n", err);
	return ret;
}

/* 1 when template `name` beneath t is saved (its template.json is there). */
static int saved(const struct sbx_root *t, const char *name)
{
	struct tpl_meta m;
	int dfd = sbx_dir_open(t, name, false, NULL, 0), ok;

	if (dfd < 0)
		return 0;
	ok = tpl_meta_read(dfd, &m, NULL, 0) == 0;
	close(dfd);
	return ok;
}

/* Template `name` removed (under its start lock: a create linking its files finishes first). */
static void remove_template(const struct sbx_root *t, const char *name)
{
	int dfd = sbx_dir_open(t, name, false, NULL, 0), lk;

	if (dfd < 0)
		return;
	lk = sbx_lock_take(dfd, SBX_LOCK_START, true, false);
	sbx_vmm_end(dfd, SIGKILL);
	sbx_tree_remove(t->dfd, name);
	tpl_run_dir_remove(t, name);
	if (lk >= 0)
		close(lk);
	close(dfd);
}

/*
 * Every other implicit template whose inputs changed (its spec's key no longer gives its name:
 * a rebuilt kernel, root image, cove-init or cove-vmm) removed: nothing would create from it
 * again. Sandboxes made from it keep their own links to its layers.
 */
static void prune_stale(const struct sbx_root *t, const char *keep)
{
	struct sbx_spec *s = malloc(sizeof(*s));
	char name[WARM_NAME_LEN + 1];
	struct dirent *e;
	int fd = dup(t->dfd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;

	if (!d && fd >= 0)
		close(fd);
	while (s && d && (e = readdir(d))) {
		int dfd;
		bool stale = false;

		if (!warm_name_is(e->d_name) || !strcmp(e->d_name, keep))
			continue;
		dfd = sbx_dir_open(t, e->d_name, false, NULL, 0);
		if (dfd < 0)
			continue;
		if (sbx_spec_read(dfd, s, NULL, 0) == 0) {
			char why[512];

			stale = key_name(s, name, sizeof(name), why, sizeof(why)) ||
				strcmp(name, e->d_name);
		}
		close(dfd);
		if (stale) {
			remove_template(t, e->d_name);
			fprintf(stderr, WHO ": removed the stale implicit template %s\n",
				e->d_name);
		}
	}
	if (d)
		closedir(d);
	free(s);
}

/* Builds implicit template `name` for s unless it is saved, under the build lock. 0 or 1. */
static int build_once(const struct sbx_root *r, const struct sbx_root *t, const char *name,
		      const struct sbx_spec *s, json_t *image)
{
	struct sbx_spec *b = malloc(sizeof(*b));
	struct tpl_meta m;
	int lk, status = 0;

	if (!b)
		return 1;
	lk = sbx_lock_take(t->dfd, WARM_BUILD_LOCK, true, false);
	if (lk < 0) {
		fprintf(stderr, WHO ": the templates' build lock: %s\n", strerror(-lk));
		free(b);
		return 1;
	}
	if (!saved(t, name)) {
		/* A directory without a record: a build that died (we hold the build lock). */
		remove_template(t, name);
		*b = *s;
		b->policy[0] = '\0';
		fprintf(stderr,
			WHO ": building the implicit template %s for this configuration (once; "
			    "later creates restore it)\n",
			name);
		status = tpl_build(r, t, name, b, NULL, NULL, 0, image, WHO, &m) ? 1 : 0;
		if (!status) {
			fprintf(stderr, WHO ": implicit template %s saved in %.2f s\n", name,
				m.build_ms / 1000.0);
			prune_stale(t, name);
		}
	}
	close(lk);
	free(b);
	return status;
}

int create_warm(const char *name, const struct sbx_spec *s, const char *policy, size_t policy_len,
		json_t *image, const char *checkpoint)
{
	struct sbx_root r = {.dfd = -1}, t = {.dfd = -1};
	char tpl[WARM_NAME_LEN + 1], err[512];
	int status = 1;

	if (warm_name(s, tpl, sizeof(tpl)))
		return 1;
	if (sbx_root_open(&r, true, err, sizeof(err)) ||
	    tpl_root_open(&r, &t, true, err, sizeof(err))) {
		fprintf(stderr, WHO ": %s\n", err);
		goto out;
	}
	if (!saved(&t, tpl) && build_once(&r, &t, tpl, s, image))
		goto out;
	status = create_from(name, tpl, s, policy, policy_len, checkpoint);
out:
	sbx_root_close(&t);
	sbx_root_close(&r);
	return status;
}
