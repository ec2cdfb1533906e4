/* The archive and delete deadlines, and removing a sandbox. */
#include "lifecycle/gc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "lifecycle/archive.h"
#include "lifecycle/broker.h"
#include "lifecycle/chain_check.h"
#include "sandbox/event_log.h"
#include "lifecycle/launch.h"
#include "lifecycle/lock.h"
#include "lifecycle/name.h"
#include "lifecycle/tombstone.h"
#include "lifecycle/tree.h"

enum sbx_gc_action sbx_gc_due(enum sbx_state state, int64_t since_ms, int64_t now_ms,
			      const struct sbx_spec *s)
{
	uint64_t idle = now_ms > since_ms ? (uint64_t)(now_ms - since_ms) : 0;

	if (state == SBX_RUNNING || state == SBX_PAUSED || state == SBX_DELETED)
		return SBX_GC_NONE;
	if (s->delete_after_ms && idle >= s->delete_after_ms)
		return SBX_GC_DELETE;
	if (s->archive_after_ms && idle >= s->archive_after_ms &&
	    (state == SBX_STOPPED || state == SBX_CRASHED))
		return SBX_GC_ARCHIVE;
	return SBX_GC_NONE;
}

int sbx_remove(const struct sbx_root *r, const char *name, int dfd, const char *from,
	       const char *why)
{
	pid_t pid = sbx_vmm_pid(dfd);
	int ret, rfd;

	/* Deleting throws the state away: no final snapshot. */
	if (pid > 0) {
		kill(pid, SIGKILL);
		for (int i = 0; i < 300 && sbx_lock_held(dfd, SBX_LOCK_VMM) == 1; i++)
			usleep(100 * 1000);
		if (sbx_lock_held(dfd, SBX_LOCK_VMM) == 1) {
			close(dfd);
			return -ETIMEDOUT;
		}
	}
	sbx_broker_end(r, name);
	sbx_event_append(dfd, from, "deleted", why);
	close(dfd);
	ret = sbx_tombstone_write(r, name, why);
	/* A process that followed the VMM (its store keeper, finishing a log line or releasing
	 * its lease) can add a file while the tree goes: the directory is then not empty. Once
	 * it is gone such a late write fails on its own; try again for up to 5 s. */
	int tr = sbx_tree_remove(r->dfd, name);
	for (int i = 0; tr == -ENOTEMPTY && i < 50; i++) {
		usleep(100 * 1000);
		tr = sbx_tree_remove(r->dfd, name);
	}
	ret = tr ?: ret;
	rfd = open(r->run, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (rfd >= 0) {
		sbx_tree_remove(rfd, name);
		close(rfd);
	}
	return ret;
}

/* One sandbox: under its start lock, so no command starts it while it is archived or deleted. */
static int gc_one(const struct sbx_root *r, const char *name, bool dry_run, bool quiet,
		  const struct sbx_gc_hooks *h)
{
	struct sbx_spec *s = calloc(1, sizeof(*s));
	struct sbx_archive_stats as;
	struct sbx_event ev;
	enum sbx_state st;
	enum sbx_gc_action a = SBX_GC_NONE;
	char err[300], why[64];
	int dfd = sbx_dir_open(r, name, false, NULL, 0), lk = -1, ret = 0;

	if (!s || dfd < 0)
		goto out;
	lk = sbx_lock_take(dfd, SBX_LOCK_START, false, false);
	if (lk < 0 || sbx_spec_read(dfd, s, NULL, 0) || sbx_state_read(dfd, &st, &ev))
		goto out; /* being started, or not a sandbox of ours: not now */
	/* A broker outlives its VMM (an idle stop, a crash) until a stop, rm or gc ends it. */
	if (!dry_run && st != SBX_RUNNING && st != SBX_PAUSED)
		sbx_broker_end(r, name);
	a = sbx_gc_due(st, ev.time_ms ? ev.time_ms : s->created_ms, realtime_ms(), s);
	if (a == SBX_GC_NONE)
		goto out;
	/* Another host took it since this host last ran it: its copy here is not the record. */
	if (h && h->may_collect && h->may_collect(name)) {
		if (!quiet || dry_run)
			printf(
			    "cove gc: %s: due to %s, but this host does not own it (above): left "
			    "alone\n",
			    name, a == SBX_GC_DELETE ? "be deleted" : "be archived");
		goto out;
	}
	if (!quiet || dry_run)
		printf("cove gc: %s: %s%s (%s for %.1f h)\n", name, dry_run ? "would " : "",
		       a == SBX_GC_DELETE ? "delete" : "archive", sbx_state_name(st),
		       (double)(realtime_ms() - ev.time_ms) / 3600e3);
	if (dry_run)
		goto out;
	if (a == SBX_GC_ARCHIVE) {
		ret = sbx_chain_check_archive(r, name, err, sizeof(err))
			  ?: sbx_archive_pack(dfd, &as, err, sizeof(err));
		if (!ret)
			sbx_event_append(dfd, sbx_state_name(st), "archived", "archive-after");
		else
			fprintf(stderr, "cove gc: %s: %s\n", name, err);
	} else {
		snprintf(why, sizeof(why), "delete-after %llus",
			 (unsigned long long)(s->delete_after_ms / 1000));
		close(lk);
		lk = -1;
		ret = sbx_remove(r, name, dfd, sbx_state_name(st), why);
		dfd = -1;
		if (!ret && h && h->deleted)
			h->deleted(name);
		if (ret)
			fprintf(stderr, "cove gc: %s: %s\n", name, strerror(-ret));
	}
out:
	if (lk >= 0)
		close(lk);
	if (dfd >= 0)
		close(dfd);
	free(s);
	return ret ? 1 : 0;
}

int sbx_gc(const struct sbx_root *r, bool dry_run, bool quiet, const struct sbx_gc_hooks *hooks)
{
	int fd = dup(r->dfd), failed = 0;
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *e;

	if (!d) {
		if (fd >= 0)
			close(fd);
		return 1;
	}
	rewinddir(
	    d); /* the dup shares its offset with r->dfd: an earlier pass left it at the end */
	while ((e = readdir(d)))
		if (!sbx_name_check(e->d_name, NULL, 0))
			failed += gc_one(r, e->d_name, dry_run, quiet, hooks);
	closedir(d);
	return failed;
}
