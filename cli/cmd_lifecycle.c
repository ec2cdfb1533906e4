/* `cove start|stop|up|pause|resume|rm NAME`: moving a created sandbox between its states. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include "cli/api_client.h"
#include "cli/commands.h"
#include "cli/store_reconnect.h"
#include "cli/sandbox_stop.h"
#include "cli/sandbox_up.h"
#include "common/errmsg.h"
#include "lifecycle/archive.h"
#include "lifecycle/chain_check.h"
#include "lifecycle/broker.h"
#include "sandbox/event_log.h"
#include "lifecycle/cache.h"
#include "lifecycle/gc.h"
#include "lifecycle/launch.h"
#include "lifecycle/lock.h"
#include "lifecycle/name.h"
#include "lifecycle/root.h"
#include "lifecycle/state.h"
#include "lifecycle/tombstone.h"
#include "lifecycle/tree.h"

struct target {
	struct sbx_root root;
	const char *name;
	int dfd;
	enum sbx_state state;
	char api[128];
};

/* Opens NAME's directory and reads its state; on failure prints one line, returns the status. */
static int open_target(const char *cmd, int argc, char **argv, struct target *t)
{
	char err[512];
	int ret;

	t->dfd = -1;
	t->root.dfd = -1;
	if (argc != 2 || argv[1][0] == '-') {
		fprintf(stderr, "usage: cove %s NAME%s\n", cmd,
			strcmp(cmd, "up") ? " [--json]   (--json: docs/CLI.md, \"JSON output\")"
					  : "");
		return argc == 2 && !strcmp(argv[1], "--help") ? -1 : 2;
	}
	t->name = argv[1];
	ret = sbx_name_check(t->name, err, sizeof(err));
	if (ret) {
		fprintf(stderr, "cove %s: %s\n", cmd, err);
		return SBX_EXIT_BAD_NAME;
	}
	if (sbx_root_open(&t->root, false, err, sizeof(err)) == 0)
		t->dfd = sbx_dir_open(&t->root, t->name, false, err, sizeof(err));
	if (t->dfd < 0) {
		if (t->root.dfd >= 0 &&
		    !sbx_tombstone_describe(&t->root, t->name, err, sizeof(err))) {
			fprintf(stderr, "cove %s: %s\n", cmd, err);
			return SBX_EXIT_DELETED;
		}
		fprintf(stderr, "cove %s: no sandbox named %s\n", cmd, t->name);
		return SBX_EXIT_UNKNOWN;
	}
	ret = sbx_state_read(t->dfd, &t->state, NULL);
	if (ret) {
		fprintf(stderr, "cove %s: %s: cannot read its state: %s\n", cmd, t->name,
			strerror(-ret));
		return 1;
	}
	sbx_run_path(&t->root, t->name, "api.sock", t->api, sizeof(t->api));
	return 0;
}

static void close_target(struct target *t)
{
	if (t->dfd >= 0)
		close(t->dfd);
	sbx_root_close(&t->root);
}

/*
 * A sandbox whose VMM no longer runs needs no broker: stop and archive end it (so does rm, and
 * gc for every stopped one). After an idle stop it lives on until one of those, or is reused by
 * the next start.
 */
static void end_broker(const char *cmd, struct target *t)
{
	int ret;

	if (t->state == SBX_RUNNING || t->state == SBX_PAUSED)
		return;
	ret = sbx_broker_end(&t->root, t->name);
	if (ret < 0)
		fprintf(stderr, "cove %s: %s: its cove-broker did not exit: %s\n", cmd, t->name,
			strerror(-ret));
}

int cmd_start(int argc, char **argv)
{
	struct target t;
	char err[512];
	/* A sandbox only the store has (made elsewhere, or evicted from this host's cache) is
	 * pulled first, as cove exec does. */
	bool pulled = false;
	int ps = argc == 2 ? store_pull_absent(argv[1], &pulled) : -1;
	if (ps == SBX_EXIT_HELD)
		return ps; /* cove-store printed its JSON line */
	if (ps == SBX_EXIT_DELETED) {
		fprintf(stderr,
			"cove start: sandbox %s was removed (its tombstone is in the store)\n",
			argv[1]);
		return ps;
	}
	int st = open_target("start", argc, argv, &t);

	if (!st)
		sbx_cache_count(&t.root, t.dfd, pulled);
	int ret = st ? 0 : sbx_start(&t.root, t.name, t.dfd, "cove start", err, sizeof(err));

	if (ret)
		st = sbx_start_exit("cove start", t.name, ret, err);
	else if (st == 0)
		printf("%s: running\n", t.name);
	close_target(&t);
	return st < 0 ? 0 : st;
}

/* stop_locked for the commands here: 0, or 1 after one line on stderr. */
static int stop_locked(const char *cmd, struct target *t, const char *why)
{
	char err[600];

	if (sbx_stop_locked(&t->root, t->name, t->dfd, t->api, &t->state, cmd, why, err,
			    sizeof(err))) {
		fprintf(stderr, "cove %s: %s: %s\n", cmd, t->name, err);
		return 1;
	}
	return 0;
}

/*
 * NAME running or paused to stopped: the final snapshot, its VMM ended, its broker ended and,
 * with a store, the final generation committed and the lease released. 0, or 1 after lines on
 * stderr (prefixed "cove CMD:").
 */
static int stop_commit(const char *cmd, struct target *t, const char *why)
{
	int st = 0, lk = sbx_lock_take(t->dfd, SBX_LOCK_START, true, false);
	sbx_state_read(t->dfd, &t->state, NULL);
	bool stopped_now = false;
	if (t->state != SBX_RUNNING && t->state != SBX_PAUSED)
		printf("%s: already %s\n", t->name, sbx_state_name(t->state));
	else if (!(st = stop_locked(cmd, t, why))) {
		printf("%s: stopped (memory and disks are in its snapshot chain)\n", t->name);
		stopped_now = true;
	}
	end_broker(cmd, t);
	if (lk >= 0)
		close(lk);
	/* With a store: stop returns once the final generation is committed there. */
	if (stopped_now) {
		int ps = store_try_push(t->name);
		if (ps > 0) {
			fprintf(
			    stderr,
			    "cove %s: %s: stopped, but its final generation is not in the store "
			    "(above); cove store push %s tries again\n",
			    cmd, t->name, t->name);
			st = 1;
		} else if (ps == 0) {
			printf("%s: its final generation is committed to the store\n", t->name);
			/* Committed: any host may run it now. */
			if (store_try_release(t->name) > 0)
				fprintf(stderr,
					"cove %s: %s: its lease is not released (above): another "
					"host can take it once it expires\n",
					cmd, t->name);
		}
	}
	fflush(stdout);
	return st;
}

int cmd_stop(int argc, char **argv)
{
	struct target t;
	int st = open_target("stop", argc, argv, &t);

	if (!st)
		st = stop_commit("stop", &t, "cove stop");
	close_target(&t);
	return st < 0 ? 0 : st;
}

/*
 * cove up NAME: the sandbox's whole life in the foreground, for a scheduler's task (Nomad's exec
 * driver, a Kubernetes Pod). Brought up as cove exec brings it up (pulled from the store and
 * its lease taken when it is not here), then watched: SIGTERM, SIGINT or SIGHUP stop it as cove
 * stop does (final snapshot, generation committed, lease released) and exit 0. Its VMM ending
 * on its own: 0 when it stopped itself (idle stop), else 1. Statuses 64-67 and 75 as cove
 * exec's, each with one line on stderr (75: cove-store's JSON line).
 */
int cmd_up(int argc, char **argv)
{
	if (argc != 2 || argv[1][0] == '-') {
		fprintf(stderr,
			"usage: cove up NAME   (in the foreground until SIGTERM: then stopped "
			"and committed, exit 0)\n");
		return argc == 2 && !strcmp(argv[1], "--help") ? 0 : 2;
	}
	/* Blocked before anything starts, so a SIGTERM during the start is answered after it;
	 * every child cove starts sets its own mask. */
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	sigprocmask(SIG_BLOCK, &set, NULL);
	int sfd = signalfd(-1, &set, SFD_CLOEXEC);
	if (sfd < 0) {
		fprintf(stderr, "cove up: signalfd: %s\n", strerror(errno));
		return 1;
	}
	char uds[256], err[600] = "";
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int st = sbx_resolve(argv[1], "cove up", uds, sizeof(uds), err, sizeof(err));
	if (st == SBX_EXIT_DELETED) /* a scheduler reads one JSON line, as for 75 */
		fprintf(stderr, "{\"error\":\"deleted\",\"sandbox\":\"%s\",\"exit\":%d}\n", argv[1],
			SBX_EXIT_DELETED);
	else if (st && err[0])
		fprintf(stderr, "cove up: %s\n", err);
	if (st) {
		close(sfd);
		return st;
	}
	struct target t;
	st = open_target("up", argc, argv, &t);
	if (st) {
		close(sfd);
		close_target(&t);
		return st < 0 ? 1 : st;
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("%s: running (up in %.1f s; SIGTERM stops it)\n", t.name,
	       (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
	fflush(stdout);
	for (;;) {
		struct pollfd p = {.fd = sfd, .events = POLLIN};
		int n = poll(&p, 1, 500);
		if (n > 0) {
			struct signalfd_siginfo si;
			if (read(sfd, &si, sizeof(si)) != (ssize_t)sizeof(si))
				continue;
			clock_gettime(CLOCK_MONOTONIC, &t0);
			st = stop_commit("up", &t, "cove up: signal");
			clock_gettime(CLOCK_MONOTONIC, &t1);
			printf("%s: %s after signal %u in %.1f s\n", t.name,
			       st ? "not cleanly stopped" : "stopped and committed", si.ssi_signo,
			       (double)(t1.tv_sec - t0.tv_sec) +
				   (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
			break;
		}
		if (sbx_lock_held(t.dfd, SBX_LOCK_VMM) == 0) {
			/* Ended without us: an idle stop, or killed (its lease moved on, a crash).
			 */
			sbx_state_read(t.dfd, &t.state, NULL);
			fprintf(stderr, "cove up: %s: its VMM ended; it is %s\n", t.name,
				sbx_state_name(t.state));
			st = t.state == SBX_STOPPED ? 0 : 1;
			break;
		}
	}
	close(sfd);
	close_target(&t);
	return st;
}

/* The local files of a sandbox the store holds: its directory and its run directory. */
static int drop_local(struct target *t)
{
	int r = sbx_tree_remove(t->root.dfd, t->name);
	int rfd = open(t->root.run, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (rfd >= 0) {
		sbx_tree_remove(rfd, t->name);
		close(rfd);
	}
	if (r)
		fprintf(stderr, "cove archive: %s: removing the local copy: %s\n", t->name,
			strerror(-r));
	return r ? 1 : 0;
}

int cmd_archive(int argc, char **argv)
{
	struct sbx_archive_stats as;
	struct target t;
	char err[512];
	int ps, lk, st = open_target("archive", argc, argv, &t);

	if (st)
		goto out;
	lk = sbx_lock_take(t.dfd, SBX_LOCK_START, true, false);
	sbx_state_read(t.dfd, &t.state, NULL);
	if (t.state == SBX_ARCHIVED) {
		printf("%s: already archived\n", t.name);
	} else if ((t.state == SBX_RUNNING || t.state == SBX_PAUSED) &&
		   (st = stop_locked("archive", &t, "cove archive"))) {
		/* the final snapshot failed: it keeps running, nothing is archived */
	} else if (store_is_configured()) {
		/*
		 * With a store, archived means only in the store: the local copy goes once the
		 * newest generation is committed there (the next exec on any host pulls it). The
		 * push takes the start lock itself; taken again after it, a sandbox some command
		 * started meanwhile is kept.
		 */
		if (lk >= 0)
			close(lk);
		ps = store_try_push(t.name);
		lk = sbx_lock_take(t.dfd, SBX_LOCK_START, true, false);
		sbx_state_read(t.dfd, &t.state, NULL);
		if (!ps && (lk < 0 || (t.state != SBX_STOPPED && t.state != SBX_CRASHED))) {
			fprintf(stderr,
				"cove archive: %s: committed to the store, but it is %s now; its "
				"local copy is kept\n",
				t.name, sbx_state_name(t.state));
			st = 1;
		} else if (ps) {
			fprintf(
			    stderr,
			    "cove archive: %s: its newest generation is not in the store (above); "
			    "nothing was removed here\n",
			    t.name);
			st = 1;
		} else {
			end_broker("archive", &t);
			store_try_release(t.name);
			st = drop_local(&t);
			if (!st)
				printf(
				    "%s: archived to the store (newest generation committed, local "
				    "files removed)\n",
				    t.name);
		}
	} else if (sbx_chain_check_archive(&t.root, t.name, err, sizeof(err)) ||
		   sbx_archive_pack(t.dfd, &as, err, sizeof(err))) {
		fprintf(stderr, "cove archive: %s: %s (its chain is as it was)\n", t.name, err);
		st = 1;
	} else {
		sbx_event_append(t.dfd, sbx_state_name(t.state), "archived", "cove archive");
		printf("%s: archived (%llu files, %.1f MiB packed into %.1f MiB)\n", t.name,
		       (unsigned long long)as.files, (double)as.bytes_in / (1 << 20),
		       (double)as.bytes_out / (1 << 20));
	}
	end_broker("archive", &t);
	if (lk >= 0)
		close(lk);
out:
	close_target(&t);
	return st < 0 ? 0 : st;
}

static int pause_resume(int argc, char **argv, bool pause)
{
	const char *cmd = pause ? "pause" : "resume";
	struct target t;
	char err[512];
	int st = open_target(cmd, argc, argv, &t);

	if (st)
		goto out;
	if (!pause && t.state != SBX_RUNNING && t.state != SBX_PAUSED) {
		/* Resuming a stopped sandbox is starting it. */
		st = sbx_start_exit(
		    "cove resume", t.name,
		    sbx_start(&t.root, t.name, t.dfd, "cove resume", err, sizeof(err)), err);
		goto out;
	}
	if (t.state != SBX_RUNNING && t.state != SBX_PAUSED) {
		fprintf(stderr, "cove pause: %s is %s\n", t.name, sbx_state_name(t.state));
		st = 1;
		goto out;
	}
	if ((pause && t.state == SBX_PAUSED) || (!pause && t.state == SBX_RUNNING))
		goto out;
	if (sbx_api_state(t.api, pause ? "Paused" : "Resumed", err, sizeof(err))) {
		fprintf(stderr, "cove %s: %s: %s\n", cmd, t.name, err);
		st = 1;
		goto out;
	}
	sbx_event_append(t.dfd, sbx_state_name(t.state), pause ? "paused" : "running",
			 pause ? "cove pause" : "cove resume");
out:
	close_target(&t);
	return st < 0 ? 0 : st;
}

int cmd_pause(int argc, char **argv)
{
	return pause_resume(argc, argv, true);
}

int cmd_resume(int argc, char **argv)
{
	return pause_resume(argc, argv, false);
}

int cmd_rm(int argc, char **argv)
{
	struct target t;
	int lk = -1, ret, st = open_target("rm", argc, argv, &t);

	if (st)
		goto out;
	/* Not while another command is starting it: wait for that, then delete. */
	lk = sbx_lock_take(t.dfd, SBX_LOCK_START, true, false);
	/* The store's tombstone first: deleted here but not there, another host could take it
	 * up again. Not written: nothing is deleted, and cove rm can be run again. */
	int ts = store_try_tombstone(t.name);
	if (ts > 0) {
		fprintf(stderr,
			"cove rm: %s: the store's tombstone could not be written (above): nothing "
			"deleted\n",
			t.name);
		st = 1;
		goto out;
	}
	ret = sbx_remove(&t.root, t.name, t.dfd, sbx_state_name(t.state), "cove rm");
	t.dfd = -1;
	if (ret) {
		fprintf(stderr, "cove rm: %s: %s\n", t.name, strerror(-ret));
		st = 1;
	} else
		printf("%s: deleted\n", t.name);
out:
	if (lk >= 0)
		close(lk);
	close_target(&t);
	return st < 0 ? 0 : st;
}

int cmd_gc(int argc, char **argv)
{
	bool dry = false;
	const char *max = NULL;
	struct sbx_root r;
	char err[512];
	uint64_t bound;
	int failed = 0, bad = 0;

	for (int i = 1; i < argc && !bad; i++) {
		if (!strcmp(argv[i], "--dry-run"))
			dry = true;
		else if (!strcmp(argv[i], "--cache-max") && i + 1 < argc)
			max = argv[++i];
		else
			bad = !strcmp(argv[i], "--help") ? -1 : 1;
	}
	if (bad) {
		fprintf(bad < 0 ? stdout : stderr,
			"usage: cove gc [--dry-run] [--cache-max SIZE] [--json]\n"
			"Archives sandboxes stopped for longer than their --archive-after and "
			"deletes those unused\nfor longer than their --delete-after. With a store, "
			"then evicts local copies of\nstopped sandboxes committed there, least "
			"recently used first, until the state root\nuses at most SIZE (512M, 2G; "
			"default store.json's cache_max).\n--json: one JSON object (docs/CLI.md, "
			"\"JSON output\").\n");
		return bad < 0 ? 0 : 2;
	}
	if (max && cache_max_parse(max, &bound)) {
		fprintf(stderr, "cove gc: --cache-max: bad size '%s' (at least 1M: 512M, 2G)\n",
			max);
		return 2;
	}
	if (max && !store_is_configured()) {
		fprintf(stderr, "cove gc: --cache-max: no store is configured ($COVE_STORE or "
				"/etc/cove/store.json): nothing here is committed anywhere, so "
				"nothing can be evicted\n");
		return 1;
	}
	if (sbx_root_open(&r, false, err, sizeof(err)))
		return 0; /* no sandboxes: nothing due, nothing cached */
	failed = sbx_gc(&r, dry, false, store_gc_hooks());
	sbx_root_close(&r);
	/* The cache bound, once the deadlines are applied: only with a store. */
	if (store_try_evict(max, dry) > 0)
		failed++;
	return failed ? 1 : 0;
}
