/* cove store push NAME / cove store pull NAME [--gen N]: a named sandbox to and from the store
 * (lifecycle/store/reconnect.h), run by cove-store. */
#include "cli/store_sandbox.h"
#include "lifecycle/template.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/api_client.h"
#include "common/clock.h"
#include "common/log.h"
#include "lifecycle/launch.h"
#include "lifecycle/proc_tree.h"
#include "lifecycle/root.h"
#include "lifecycle/state.h"
#include "lifecycle/store/catalog.h"
#include "lifecycle/store/gc.h"
#include "lifecycle/store/lease.h"
#include "lifecycle/store/reconnect.h"
#include "lifecycle/store/store_config.h"
#include "sandbox/event_log.h"

/*
 * The follower pauses and resumes the VM over its API socket (lease_keeper.h). A loaded host
 * can take seconds to carry an API pause out (a fresh-clone rehearsal saw 8.9 s, past the
 * lease's expiry), so a pause the API has not confirmed within PAUSE_API_WAIT_S is done by the
 * kernel instead: SIGSTOP to the VMM and its descendants (a jailed VMM is its waiter's child),
 * which stops every vCPU wherever it is. The resume sends SIGCONT first.
 */
#define PAUSE_API_WAIT_S 2

struct vm_pauser {
	const struct sbx_root *root;
	const char *name;
	pid_t stopped; /* the VMM stopped by SIGSTOP, 0 none */
	bool unsure;   /* a pause neither the API nor the backstop confirmed: it may land late */
};

/* The VM's state from GET /vm into out ("Paused", "Running", ...); 0, or -errno. */
static int vm_state(const char *api, char *out, size_t cap)
{
	long status = 0;
	char *reply = NULL, err[256];
	int r = api_call(api, "GET", "/vm", NULL, 5, &status, &reply, err, sizeof(err));
	if (!r && status != 200)
		r = -EIO;
	json_t *j = r ? NULL : json_loads(reply, 0, NULL);
	const char *st = json_string_value(json_object_get(j, "state"));
	if (!r && !st)
		r = -EPROTO;
	if (!r)
		snprintf(out, cap, "%s", st);
	json_decref(j);
	free(reply);
	return r;
}

/*
 * After a resume that follows an unconfirmed pause: that pause may still be queued at the VMM
 * (its API was busy restoring) and land after the resume. Checks for up to 10 s that the VM
 * runs, resuming it again when a late pause landed.
 */
static void resume_settle(const char *api)
{
	char st[32];
	for (int i = 0; i < 20; i++) {
		if (!vm_state(api, st, sizeof(st)) && !strcmp(st, "Paused")) {
			long status = 0;
			char *reply = NULL, err[256];
			api_call(api, "PATCH", "/vm", "{\"state\":\"Resumed\"}", 10, &status,
				 &reply, err, sizeof(err));
			free(reply);
		}
		struct timespec ts = {0, 500 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
}

/* The backstop: the VMM's process tree stopped. 0, or -errno. */
static int stop_vmm(struct vm_pauser *p, const char *why)
{
	char err[256];
	int dfd = sbx_dir_open(p->root, p->name, false, err, sizeof(err));
	pid_t pid = dfd >= 0 ? sbx_vmm_pid(dfd) : -1;
	if (dfd >= 0)
		close(dfd);
	int n = pid > 0 ? proc_tree_signal(pid, SIGSTOP) : -ESRCH;
	if (n < 0)
		return n;
	p->stopped = pid;
	fprintf(stderr,
		"cove store: %s: the VM's API did not pause it within %d s (%s): its %d processes "
		"stopped (SIGSTOP) instead\n",
		p->name, PAUSE_API_WAIT_S, why, n);
	return 0;
}

static int pause_vm(void *arg, bool paused)
{
	struct vm_pauser *p = arg;
	char api[160], err[256];
	long status = 0;
	char *reply = NULL;
	if (sbx_run_path(p->root, p->name, "api.sock", api, sizeof(api)))
		return -ENAMETOOLONG;
	if (!paused && p->stopped > 0) {
		proc_tree_signal(p->stopped, SIGCONT);
		p->stopped = 0;
	}
	int r = api_call(api, "PATCH", "/vm",
			 paused ? "{\"state\":\"Paused\"}" : "{\"state\":\"Resumed\"}",
			 paused ? PAUSE_API_WAIT_S : 10, &status, &reply, err, sizeof(err));
	free(reply);
	r = r ? r : status / 100 == 2 ? 0 : -EIO;
	if (r && paused && stop_vmm(p, r == -EIO ? "it refused" : err) == 0)
		r = 0;
	else if (r && paused)
		p->unsure = true;
	if (!r && !paused && p->unsure) {
		p->unsure = false;
		resume_settle(api);
	}
	/* In its event log too: cove ls shows it paused, and a cove exec here does not resume it
	 * (store_check_held) while the lease is in doubt. */
	int dfd = r ? -1 : sbx_dir_open(p->root, p->name, false, err, sizeof(err));
	enum sbx_state st;
	/* A resume records one only after a recorded pause (a pause the API refused has none). */
	if (dfd >= 0 && !paused && (sbx_state_read(dfd, &st, NULL) || st != SBX_PAUSED)) {
		close(dfd);
		dfd = -1;
	}
	if (dfd >= 0) {
		sbx_event_append(dfd, paused ? "running" : "paused", paused ? "paused" : "running",
				 paused ? "lease in doubt: the store did not answer its renewal"
					: "lease renewed");
		close(dfd);
	}
	return r;
}

int store_sandbox_cmd(int argc, char **argv)
{
	bool push = !strcmp(argv[0], "push"), tomb = !strcmp(argv[0], "tombstone"),
	     follow = !strcmp(argv[0], "follow"), take = !strcmp(argv[0], "take"),
	     release = !strcmp(argv[0], "release"), held = !strcmp(argv[0], "held"),
	     owner = !strcmp(argv[0], "owner");
	bool pull = !push && !tomb && !follow && !take && !release && !held && !owner, tpl = false;
	const char *config = NULL, *name = NULL;
	uint64_t gen = 0;
	for (int i = 1; i < argc; i++) {
		char *end;
		if (!strcmp(argv[i], "--config") && i + 1 < argc) {
			config = argv[++i];
		} else if ((push || pull) && !strcmp(argv[i], "--template")) {
			tpl = true; /* NAME is a template (lifecycle/template.h) */
		} else if (!push && !take && !release && !held && !owner &&
			   !strcmp(argv[i], "--gen") && i + 1 < argc) {
			gen = strtoull(argv[++i], &end, 10);
			if (*end || !gen) {
				fprintf(stderr, "cove store pull: --gen wants a generation >= 1\n");
				return 2;
			}
		} else if (!name && argv[i][0] != '-') {
			name = argv[i];
		} else {
			fprintf(stderr, "usage: cove store %s NAME [--config FILE]%s\n", argv[0],
				push ? "" : " [--gen N]");
			return 2;
		}
	}
	if (!name) {
		fprintf(stderr, "cove store %s: which sandbox?\n", argv[0]);
		return 2;
	}
	struct logger log = {.level = LOG_INFO, .out = stderr, .name = "cove store"};
	/*
	 * A sandbox's generations ride through a store restart: 10 attempts with backoff up to
	 * 5 s wait about 20 s in all (a radosgw comes back in 2-10 s here), where the client's
	 * default of 6 gives up after about 3 s.
	 */
	struct s3_opts sandbox_opts = {.log = &log, .max_attempts = 10};
	struct store_config *cfg = calloc(1, sizeof(*cfg));
	struct s3_client *c = NULL;
	struct sbx_root root = {.dfd = -1};
	struct store_sync_stats st;
	char err[600] = "";
	int r = cfg ? store_config_load(config, cfg, err, sizeof(err)) : -ENOMEM;
	if (!r)
		r = s3_client_new(cfg, &sandbox_opts, &c, err, sizeof(err));
	/* The state root: push reads it, pull makes it; tombstone needs none. */
	if (!r && !tomb)
		r = sbx_root_open(&root, !push && !follow && !take && !release && !held && !owner,
				  err, sizeof(err));
	/* Templates: their own root beneath the state root, their own prefix in the store. */
	struct sbx_root troot = {.dfd = -1};
	if (!r && tpl)
		r = tpl_root_open(&root, &troot, pull, err, sizeof(err));
	const struct sbx_root *rp = tpl ? &troot : &root;
	struct vm_pauser pz = {.root = &root, .name = name};
	struct store_follow_hooks hooks = {.set_paused = pause_vm, .arg = &pz};
	struct store_lease other = {0};
	struct store_lease mine = {0};
	if (!r && held) {
		/* No store traffic: this host's record decides, before a paused VM resumes. */
		r = store_check_held(cfg, &root, name, realtime_ms(), &mine, err, sizeof(err));
		if (r == -EBUSY) {
			json_t *j = json_pack("{s:s,s:s,s:s,s:I,s:I,s:i}", "error",
					      "lease-in-doubt", "sandbox", name, "host", mine.host,
					      "expires_ms", (json_int_t)mine.expires_ms, "epoch",
					      (json_int_t)mine.epoch, "exit", STORE_EXIT_HELD);
			char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
			fprintf(stderr, "%s\n", text ? text : "{\"error\":\"lease-in-doubt\"}");
			free(text);
			json_decref(j);
			r = STORE_EXIT_HELD;
		}
		if (root.dfd >= 0)
			sbx_root_close(&root);
		s3_client_free(c);
		store_config_wipe(cfg);
		free(cfg);
		if (r && r != STORE_EXIT_HELD)
			log_err(&log, "%s", err[0] ? err : strerror(-r));
		return r == STORE_EXIT_HELD ? r : r ? 1 : 0;
	}
	if (!r && owner) {
		r = store_check_owner(c, cfg, &root, name, &mine, err, sizeof(err));
		if (r == -EBUSY) {
			json_t *j = json_pack("{s:s,s:s,s:s,s:I,s:I,s:i}", "error", "not-owner",
					      "sandbox", name, "host", mine.host, "expires_ms",
					      (json_int_t)mine.expires_ms, "epoch",
					      (json_int_t)mine.epoch, "exit", STORE_EXIT_HELD);
			char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
			fprintf(stderr, "%s\n", text ? text : "{\"error\":\"not-owner\"}");
			free(text);
			json_decref(j);
			log_err(&log, "%s", err);
		} else if (r) {
			log_err(&log, "%s", err[0] ? err : strerror(-r));
		}
		sbx_root_close(&root);
		s3_client_free(c);
		store_config_wipe(cfg);
		free(cfg);
		return r == -EBUSY ? STORE_EXIT_HELD : r ? 1 : 0;
	}
	if (!r)
		r = tomb     ? store_put_tombstone(c, name, err, sizeof(err))
		    : follow ? store_follow(c, cfg, &root, name, &log, &hooks, err, sizeof(err))
		    : push   ? store_push_sandbox(c, cfg, rp, name, &st, err, sizeof(err))
		    : take ? store_take_sandbox(c, cfg, &root, name, &log, &other, err, sizeof(err))
		    : release ? store_release_sandbox(c, cfg, &root, name, err, sizeof(err))
			      : store_pull_sandbox(c, cfg, rp, name, gen, &st, err, sizeof(err));
	/* Not in the store yet, but running elsewhere: say where, as take does. */
	char lerr[256];
	if (r == -ENOENT && c && !tpl && !push && !tomb && !follow && !take && !release &&
	    store_lease_read(c, cfg, name, &other, lerr, sizeof(lerr)) == 0 && other.host[0] &&
	    strcmp(other.host, cfg->host_id) && other.expires_ms > realtime_ms())
		r = -EBUSY, take = true;
	if (troot.dfd >= 0)
		sbx_root_close(&troot);
	if (root.dfd >= 0)
		sbx_root_close(&root);
	s3_client_free(c);
	if (cfg)
		store_config_wipe(cfg);
	free(cfg);
	if (r == -EBUSY && take) {
		/* Held by another host: one JSON line, the exit status scripts branch on. */
		json_t *j =
		    json_pack("{s:s,s:s,s:s,s:I,s:I,s:i}", "error", "held", "sandbox", name, "host",
			      other.host, "expires_ms", (json_int_t)other.expires_ms, "epoch",
			      (json_int_t)other.epoch, "exit", STORE_EXIT_HELD);
		char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
		fprintf(stderr, "%s\n", text ? text : "{\"error\":\"held\"}");
		free(text);
		json_decref(j);
		return STORE_EXIT_HELD;
	}
	if (r) {
		/* Gone from the store (tombstone): the exit status cove gives a removed sandbox;
		 * cove, which runs pull for an exec, says so in its own one line. */
		bool removed = r == -EIDRM && !tomb && !follow;
		if (!removed || !getenv("COVE_STORE_QUIET_REMOVED"))
			log_err(&log, "%s", err[0] ? err : strerror(-r));
		return removed ? 66 : 1;
	}
	if (take || release)
		printf("%s: lease %s\n", name, take ? "held by this host" : "released");
	else if (tomb)
		printf("%s: tombstone in the store: every host now answers it was removed\n", name);
	else if (push)
		printf("%s: generation %llu committed: %llu files, %llu blobs sent (%llu bytes), "
		       "%llu already in the store\n",
		       name, (unsigned long long)st.generation, (unsigned long long)st.files,
		       (unsigned long long)st.blobs_sent, (unsigned long long)st.bytes_sent,
		       (unsigned long long)st.blobs_present);
	else if (!follow)
		printf("%s: generation %llu fetched: %llu files, %llu blobs (%llu bytes); stopped, "
		       "ready to start\n",
		       name, (unsigned long long)st.generation, (unsigned long long)st.files,
		       (unsigned long long)st.blobs_sent, (unsigned long long)st.bytes_sent);
	return 0;
}

int store_gc_cmd(int argc, char **argv)
{
	const char *config = NULL;
	unsigned long keep = STORE_GC_KEEP_DEFAULT, grace = STORE_GC_GRACE_DEFAULT;
	for (int i = 1; i < argc; i++) {
		char *end = NULL;
		if (!strcmp(argv[i], "--config") && i + 1 < argc) {
			config = argv[++i];
		} else if (!strcmp(argv[i], "--keep") && i + 1 < argc) {
			keep = strtoul(argv[++i], &end, 10);
		} else if (!strcmp(argv[i], "--grace") && i + 1 < argc) {
			grace = strtoul(argv[++i], &end, 10); /* seconds */
		} else {
			fprintf(stderr,
				"usage: cove store gc [--keep K] [--grace SECONDS] [--config "
				"FILE]\n");
			return 2;
		}
		if (end && (*end || !keep || keep > 1000000)) {
			fprintf(stderr, "cove store gc: --keep wants 1 or more, --grace seconds\n");
			return 2;
		}
	}
	struct logger log = {.level = LOG_INFO, .out = stderr, .name = "cove store"};
	struct store_config *cfg = calloc(1, sizeof(*cfg));
	struct s3_client *c = NULL;
	struct store_gc_stats st;
	char err[600] = "";
	int r = cfg ? store_config_load(config, cfg, err, sizeof(err)) : -ENOMEM;
	if (!r && !cfg->fleet_key_len)
		r = -ENOKEY, snprintf(err, sizeof(err), "store.json names no fleet_key_file");
	if (!r)
		r = s3_client_new(cfg, &(struct s3_opts){.log = &log}, &c, err, sizeof(err));
	if (!r) {
		struct store_keyring kr = {cfg->fleet_key, cfg->fleet_key_len};
		r = store_gc(c, &kr, (unsigned)keep, (int64_t)grace, (int64_t)time(NULL), &st, err,
			     sizeof(err));
	}
	s3_client_free(c);
	if (cfg)
		store_config_wipe(cfg);
	free(cfg);
	if (r) {
		log_err(&log, "%s", err);
		return 1;
	}
	printf("store gc: %llu sandboxes, %llu generations kept, %llu removed; %llu blobs: %llu "
	       "named, %llu within the grace period, %llu removed (%llu bytes)\n",
	       (unsigned long long)st.sandboxes, (unsigned long long)st.manifests_kept,
	       (unsigned long long)st.manifests_removed, (unsigned long long)st.blobs,
	       (unsigned long long)st.blobs_kept, (unsigned long long)st.blobs_young,
	       (unsigned long long)st.blobs_removed, (unsigned long long)st.bytes_removed);
	return 0;
}

/*
 * `cove store ls --json`: [{"format": 1, "name", "newest", "kept", "committed_s" (epoch seconds,
 * 0 unknown), "lag_s" (-1 unknown), "state": "stored" | "removed"}], what `cove ls` merges.
 */
static int print_catalog_json(const struct store_sandbox *v, size_t n, time_t now)
{
	json_t *all = json_array();
	for (size_t i = 0; all && i < n; i++) {
		json_t *j = json_pack("{s:i,s:s,s:I,s:I,s:I,s:I,s:s}", "format", 1, "name",
				      v[i].name, "newest", (json_int_t)v[i].newest, "kept",
				      (json_int_t)v[i].generations, "committed_s",
				      (json_int_t)v[i].committed, "lag_s",
				      (json_int_t)(v[i].committed ? now - v[i].committed : -1),
				      "state", v[i].removed ? "removed" : "stored");
		if (!j || json_array_append_new(all, j)) {
			json_decref(all);
			return -ENOMEM;
		}
	}
	char *text = all ? json_dumps(all, JSON_COMPACT) : NULL;
	json_decref(all);
	if (!text)
		return -ENOMEM;
	printf("%s\n", text);
	free(text);
	return 0;
}

int store_ls_cmd(int argc, char **argv)
{
	const char *config = NULL;
	bool as_json = false;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--config") && i + 1 < argc) {
			config = argv[++i];
		} else if (!strcmp(argv[i], "--json")) {
			as_json = true;
		} else {
			fprintf(stderr, "usage: cove store ls [--json] [--config FILE]\n");
			return 2;
		}
	}
	struct logger log = {.level = LOG_INFO, .out = stderr, .name = "cove store"};
	struct store_config *cfg = calloc(1, sizeof(*cfg));
	struct s3_client *c = NULL;
	struct store_sandbox *v = NULL;
	size_t n = 0;
	char err[600] = "";
	int r = cfg ? store_config_load(config, cfg, err, sizeof(err)) : -ENOMEM;
	if (!r)
		r = s3_client_new(cfg, &(struct s3_opts){.log = &log}, &c, err, sizeof(err));
	if (!r)
		r = store_catalog(c, 100000, &v, &n, err, sizeof(err));
	s3_client_free(c);
	if (cfg)
		store_config_wipe(cfg);
	free(cfg);
	if (r) {
		log_err(&log, "%s", err);
		return 1;
	}
	time_t now = time(NULL);
	if (as_json) {
		r = print_catalog_json(v, n, now);
		free(v);
		return r ? 1 : 0;
	}
	printf("%-48s %10s %6s %12s  %s\n", "NAME", "NEWEST", "KEPT", "LAG", "STATE");
	for (size_t i = 0; i < n; i++) {
		char lag[32] = "-";
		if (v[i].committed)
			snprintf(lag, sizeof(lag), "%llds", (long long)(now - v[i].committed));
		printf("%-48s %10llu %6llu %12s  %s\n", v[i].name, (unsigned long long)v[i].newest,
		       (unsigned long long)v[i].generations, lag,
		       v[i].removed ? "removed" : "stored");
	}
	free(v);
	return 0;
}
