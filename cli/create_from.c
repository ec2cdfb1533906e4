/* `cove create NAME --from T`: the template's newest snapshot cloned and restored. */
#include "cli/create_from.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/policy_opt.h"
#include "cli/sandbox_up.h"
#include "cli/store_reconnect.h"
#include "common/clock.h"
#include "common/errmsg.h"
#include "lifecycle/chain_check.h"
#include "lifecycle/clone.h"
#include "lifecycle/gc.h"
#include "lifecycle/lock.h"
#include "lifecycle/root.h"
#include "lifecycle/import.h"
#include "lifecycle/template.h"
#include "lifecycle/tree.h"
#include "lifecycle/warm.h"

/* Under the template's start lock: its record checked, then the clone. 0 or the status. */
static int clone_locked(const struct sbx_root *r, const char *name, const char *tpl, int tdfd,
			struct sbx_clone_stats *st)
{
	char err[600], cause[80];
	struct tpl_meta m;
	int lk = sbx_lock_take(tdfd, SBX_LOCK_START, true, false), ret, status = 0;

	if (lk < 0) {
		fprintf(stderr, "cove create: template %s: start lock: %s\n", tpl, strerror(-lk));
		return 1;
	}
	if (tpl_meta_read(tdfd, &m, err, sizeof(err))) {
		fprintf(stderr, "cove create: template %s: %s\n", tpl, err);
		status = 1;
		goto out;
	}
	snprintf(cause, sizeof(cause), "cove create --from %s", tpl);
	ret = sbx_clone(r, tpl, tdfd, name, SBX_CLONE_TEMPLATE, cause, st, err, sizeof(err));
	if (ret) {
		fprintf(stderr, "cove create: %s: %s\n", ret == -EEXIST ? name : tpl, err);
		status = 1;
	}
out:
	close(lk);
	return status;
}

/* The clone's own lifecycle settings, created time and policy (when one was given) into its
 * spec. */
static int set_lifecycle(const struct sbx_root *r, const char *name, int dfd,
			 const struct sbx_spec *opts, const char *policy, size_t policy_len,
			 char *err, size_t errlen)
{
	struct sbx_spec *s = malloc(sizeof(*s));
	int ret;

	if (!s)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	ret = sbx_spec_read(dfd, s, err, errlen);
	if (!ret) {
		s->snapshot_every_ms = opts->snapshot_every_ms;
		s->idle_stop_ms = opts->idle_stop_ms;
		s->archive_after_ms = opts->archive_after_ms;
		s->delete_after_ms = opts->delete_after_ms;
		s->created_ms = realtime_ms();
		/* Its own policy in place of the template's copy (sbx_clone kept that). */
		if (policy)
			ret = policy_keep(r, name, dfd, s, policy, policy_len, err, errlen);
		if (!ret && (ret = sbx_spec_write(dfd, s)))
			errmsg(err, errlen, ret, "cannot write its spec: %s", strerror(-ret));
	}
	free(s);
	return ret;
}

int create_from(const char *name, const char *tpl, const struct sbx_spec *opts, const char *policy,
		size_t policy_len, const char *checkpoint)
{
	struct sbx_root r = {.dfd = -1}, t = {.dfd = -1};
	struct sbx_clone_stats st;
	char err[600];
	int tdfd = -1, dfd = -1, status = 1;

	if (sbx_root_open(&r, true, err, sizeof(err))) {
		fprintf(stderr, "cove create: %s\n", err);
		goto out;
	}
	if (tpl_root_open(&r, &t, true, NULL, 0) == 0)
		tdfd = sbx_dir_open(&t, tpl, false, NULL, 0);
	/* Not here: from the store, when one is configured (fetched whole, once per host; its
	 * stamps frozen, as a saved template's are: no process here ever wrote its files). */
	if (tdfd == -ENOENT && !warm_name_is(tpl) && store_try_template("pull", tpl) == 0) {
		if (sbx_chain_stamps_freeze(&t, tpl, err, sizeof(err)))
			fprintf(stderr, "cove create: template %s: %s\n", tpl, err);
		tdfd = sbx_dir_open(&t, tpl, false, NULL, 0);
	}
	if (t.dfd < 0 || tdfd < 0) {
		fprintf(stderr, "cove create: no template named %s (cove template ls)\n", tpl);
		status = SBX_EXIT_UNKNOWN;
		goto out;
	}
	status = clone_locked(&r, name, tpl, tdfd, &st);
	if (status)
		goto out;
	status = 1;
	dfd = sbx_dir_open(&r, name, false, err, sizeof(err));
	struct sbx_archive_stats as;
	if (dfd < 0 || set_lifecycle(&r, name, dfd, opts, policy, policy_len, err, sizeof(err)) ||
	    (checkpoint && sbx_import_archive(dfd, checkpoint, &as, err, sizeof(err)))) {
		fprintf(stderr, "cove create: %s: %s\n", name, err);
		if (dfd >= 0)
			close(dfd);
		dfd = -1;
		sbx_tree_remove(r.dfd, name); /* never started: leave nothing */
		goto out;
	}
	if (sbx_start(&r, name, dfd, "cove create", err, sizeof(err))) {
		fprintf(stderr,
			"cove create: %s: %s (its files stay in %s/%s; cove rm %s removes them)\n",
			name, err, r.state, name, name);
		status = SBX_EXIT_START;
		goto out;
	}
	sbx_gc(&r, false, true, store_gc_hooks()); /* deadlines of other sandboxes, in passing */
	printf("%s: running (from %stemplate %s: %llu files shared, %llu copied)\n", name,
	       warm_name_is(tpl) ? "the implicit " : "", tpl, (unsigned long long)st.linked,
	       (unsigned long long)st.copied);
	status = 0;
out:
	if (dfd >= 0)
		close(dfd);
	if (tdfd >= 0)
		close(tdfd);
	sbx_root_close(&t);
	sbx_root_close(&r);
	return status;
}
