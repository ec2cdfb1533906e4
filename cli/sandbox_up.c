/* Starting a named sandbox on demand: the lifecycle's reconnect path. */
#include "cli/sandbox_up.h"
#include "cli/store_reconnect.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/api_client.h"
#include "common/clock.h"
#include "common/errmsg.h"
#include "lifecycle/archive.h"
#include "lifecycle/broker.h"
#include "lifecycle/chain_check.h"
#include "lifecycle/launch.h"
#include "lifecycle/lazy_files.h"
#include "lifecycle/lock.h"
#include "lifecycle/name.h"
#include "lifecycle/policy.h"
#include "lifecycle/spec.h"
#include "lifecycle/state.h"
#include "lifecycle/store_stats.h"
#include "lifecycle/tombstone.h"
#include "lifecycle/cache_stats.h"
#include "lifecycle/vmm_args.h"
#include "sandbox/agent_client.h"
#include "sandbox/restore_sandbox.h"
#include "cli/ca_install.h"

/* How long a start may take before the command gives up (a box boots in seconds). */
#define START_WAIT_S 300
/* How long a VMM that logged its own stop may take to end its process. */
#define EXITING_WAIT_S 30

/* The chain has a committed layer (chain.json is renamed into place last). */
/* A chain to restore: chain.json, or only generation files chain.N.json (a chain fetched
 * from a periodic commit of a VMM still running elsewhere, never folded). */
static bool has_chain(int dfd)
{
	struct stat st;
	char path[64];

	snprintf(path, sizeof(path), "%s/chain.json", SBX_CHAIN);
	if (fstatat(dfd, path, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
		return true;
	int cfd = openat(dfd, SBX_CHAIN, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	DIR *d = cfd >= 0 ? fdopendir(cfd) : NULL;
	bool found = false;
	struct dirent *e;
	while (d && !found && (e = readdir(d))) {
		size_t n = strlen(e->d_name);
		found = e->d_type == DT_REG && n > 11 && !strncmp(e->d_name, "chain.", 6) &&
			!strcmp(e->d_name + n - 5, ".json") &&
			strspn(e->d_name + 6, "0123456789") == n - 11;
	}
	if (d)
		closedir(d);
	else if (cfd >= 0)
		close(cfd);
	return found;
}

static int agent_ready(const char *uds, char *err, size_t errlen)
{
	json_t *req = json_pack("{s:s}", "op", "status"), *reply = NULL;
	int fd = agent_call(uds, 2.0, req, &reply, err, errlen);

	json_decref(req);
	json_decref(reply);
	if (fd >= 0)
		close(fd);
	return fd < 0 ? fd : 0;
}

void sbx_cpu_refused(const char *name, const char *detail)
{
	json_t *j = json_pack("{s:s,s:s,s:s,s:i}", "error", "cpu-incompatible", "sandbox", name,
			      "detail", detail, "exit", SBX_EXIT_CPU);
	char *line = j ? json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;

	if (line)
		fprintf(stderr, "%s\n", line);
	else
		fprintf(stderr, "cove: %s: this host's CPU cannot take its state: %s\n", name,
			detail);
	free(line);
	json_decref(j);
}

int sbx_start_exit(const char *cmd, const char *name, int ret, const char *err)
{
	if (!ret)
		return 0;
	if (ret == -ENOEXEC) {
		sbx_cpu_refused(name, err);
		return SBX_EXIT_CPU;
	}
	if (ret == -EUSERS)
		return SBX_EXIT_HELD;
	if (err[0])
		fprintf(stderr, "%s: %s: %s\n", cmd, name, err);
	return SBX_EXIT_START;
}

/*
 * A restoring VMM's word on its --ready-fd pipe: 0 once it says "ok" (its vCPUs run), else its
 * one-line error, or its log's last line when it ended without a word.
 */
static int wait_restored(int dfd, int ready_rd, double deadline, char *err, size_t errlen)
{
	char buf[256], tail[300];
	size_t got = 0;

	while (got < sizeof(buf) - 1) {
		struct pollfd p = {.fd = ready_rd, .events = POLLIN};
		int left = (int)((deadline - mono_s()) * 1000), k;
		ssize_t n;

		if (left <= 0)
			return errmsg(err, errlen, -ETIMEDOUT,
				      "the sandbox's VMM did not restore within %d s",
				      START_WAIT_S);
		k = poll(&p, 1, left);
		if (k < 0 && errno != EINTR)
			return errmsg(err, errlen, -errno, "poll: %s", strerror(errno));
		if (k <= 0)
			continue;
		n = read(ready_rd, buf + got, sizeof(buf) - 1 - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
		if (memchr(buf, '\n', got))
			break;
	}
	buf[got] = '\0';
	if (!strncmp(buf, "ok\n", 3))
		return 0;
	buf[strcspn(buf, "\n")] = '\0';
	if (!strncmp(buf, RESTORE_CPU_REFUSED, strlen(RESTORE_CPU_REFUSED)))
		return errmsg(err, errlen, -ENOEXEC, "%s", buf + strlen(RESTORE_CPU_REFUSED));
	if (buf[0] && strcmp(buf, "restore failed (see its log)"))
		return errmsg(err, errlen, -EIO, "the sandbox's VMM could not restore: %s", buf);
	sbx_vmm_log_tail(dfd, tail, sizeof(tail));
	return errmsg(err, errlen, -ECHILD, "the sandbox's VMM exited while starting%s%s",
		      tail[0] ? ": " : "", tail);
}

/*
 * Waits until the new VMM's guest answers, or the VMM dies, or START_WAIT_S pass. g: the broker's
 * grant for the guest (a sandbox with a policy), else NULL. ready_rd: a restoring VMM's
 * --ready-fd pipe (-1 for a boot): its guest is asked at once when it says it runs.
 */
static int wait_ready(int dfd, pid_t pid, const char *uds, int ready_rd, const struct sbx_grant *g,
		      struct agent_machine *m, char *err, size_t errlen)
{
	double deadline = mono_s() + START_WAIT_S;
	bool restored = ready_rd >= 0;
	char tail[300];
	int ret;

	if (restored) {
		ret = wait_restored(dfd, ready_rd, deadline, err, errlen);
		if (ret)
			return ret;
	}
	for (;;) {
		int st;

		if (waitpid(pid, &st, WNOHANG) == pid) {
			sbx_vmm_log_tail(dfd, tail, sizeof(tail));
			return errmsg(err, errlen, -ECHILD,
				      "the sandbox's VMM exited while starting%s%s",
				      tail[0] ? ": " : "", tail);
		}
		/*
		 * After a restore: a new RNG seed, the host's clock, a new broker grant (a void
		 * token without a policy), the sandbox's hostname and machine id; it doubles as the
		 * readiness check. A fresh boot gets the same once its agent answers.
		 */
		if (restored)
			ret = agent_send_identity_as(uds, g ? g->epoch : 0, g ? g->token : NULL, m,
						     AGENT_IDENTITY_HANDSHAKE_S, err, errlen);
		else
			ret = agent_ready(uds, err, errlen)
				  ?: agent_send_identity_as(uds, g ? g->epoch : 0,
							    g ? g->token : NULL, m,
							    AGENT_IDENTITY_WAIT_S, err, errlen);
		if (ret == 0)
			return 0;
		if (mono_s() > deadline)
			return errmsg(err, errlen, -ETIMEDOUT,
				      "the guest agent did not answer within %d s", START_WAIT_S);
		usleep(20 * 1000); /* a booting guest's agent answers after a few seconds */
	}
}

int sbx_api_state(const char *api, const char *state, char *err, size_t errlen)
{
	char body[64], fault[256];
	long status;
	char *reply = NULL;
	int ret;

	snprintf(body, sizeof(body), "{\"state\":\"%s\"}", state);
	ret = api_call(api, "PATCH", "/vm", body, 30, &status, &reply, err, errlen);
	if (!ret && status / 100 != 2) {
		api_fault_text(reply, fault, sizeof(fault));
		ret = errmsg(err, errlen, -EIO, "%s", fault);
	}
	free(reply);
	return ret;
}

/*
 * The sandbox's state once a VMM that is on its way out has gone: an idle stop logs
 * running -> stopped and then ends its process, and a command that came in between would find
 * it "running" and connect to a socket about to close. Such a VMM is waited for (its final
 * snapshot is already committed), so the caller restores it instead.
 */
static int read_settled_state(int dfd, enum sbx_state *st)
{
	double deadline = mono_s() + EXITING_WAIT_S;
	struct sbx_event last;
	int ret;

	for (;;) {
		memset(&last, 0, sizeof(last));
		ret = sbx_state_read(dfd, st, &last);
		if (ret || *st != SBX_RUNNING || strcmp(last.to, "stopped") || mono_s() > deadline)
			return ret;
		usleep(50 * 1000);
	}
}

/*
 * A running sandbox with a policy whose broker has gone (killed, crashed): a new broker, a new
 * grant, and the guest told, so credential requests work again. Not fatal: the command the
 * user asked for does not need the broker; a failure is one warning line.
 */
static void broker_keep(const struct sbx_root *r, const char *name, int dfd, const char *uds)
{
	struct sbx_spec *spec;
	struct sbx_grant g = {0};
	char err[512];
	int ret;

	if (faccessat(dfd, SBX_POLICY, F_OK, AT_SYMLINK_NOFOLLOW) < 0 ||
	    sbx_broker_running(r, name) != 0)
		return;
	spec = calloc(1, sizeof(*spec));
	if (!spec)
		return;
	ret = sbx_spec_read(dfd, spec, err, sizeof(err));
	if (!ret && spec->policy[0])
		ret = sbx_broker_up(r, name, dfd, spec->policy, err, sizeof(err))
			  ?: sbx_broker_grant(r, name, dfd, &g, err, sizeof(err))
			  ?: agent_send_identity(uds, g.epoch, g.token, AGENT_IDENTITY_WAIT_S, err,
						 sizeof(err));
	if (ret)
		fprintf(stderr,
			"cove: warning: %s: its credential broker was gone and could not be "
			"started again: %s\n",
			name, err);
	explicit_bzero(&g, sizeof(g));
	free(spec);
}

int sbx_start(const struct sbx_root *r, const char *name, int dfd, const char *why, char *err,
	      size_t errlen)
{
	struct sbx_spec *spec = NULL;
	struct sbx_args *args = NULL;
	struct sbx_grant grant = {0};
	enum sbx_state st;
	char uds[128], api[128];
	bool restore;
	int ready[2] = {-1, -1}, lazy_sv[2] = {-1, -1};
	bool leased = false;
	pid_t pid;
	int lk, ret;

	/* One start at a time: later callers wait here, then find it running. */
	lk = sbx_lock_take(dfd, SBX_LOCK_START, true, false);
	if (lk < 0)
		return errmsg(err, errlen, lk, "%s: start lock: %s", name, strerror(-lk));
	ret = read_settled_state(dfd, &st);
	if (ret) {
		errmsg(err, errlen, ret, "%s: cannot read its state (%s)", name, strerror(-ret));
		goto out;
	}
	sbx_run_path(r, name, "api.sock", api, sizeof(api));
	sbx_run_path(r, name, "vsock.sock", uds, sizeof(uds));
	if (st == SBX_RUNNING) {
		broker_keep(r, name, dfd, uds);
		goto out;
	}
	if (st == SBX_PAUSED) {
		/* Its lease keeper may have paused it (the store out of reach): only the keeper
		 * resumes it then, once renewed; another host may be about to take it over. */
		int hs = r->templates ? -1 : store_try_held(name);
		if (hs > 0) {
			ret = hs == SBX_EXIT_HELD ? -EUSERS : -ENOLCK;
			if (errlen)
				err[0] = '\0';
			goto out;
		}
		ret = sbx_api_state(api, "Resumed", err, errlen);
		if (!ret)
			ret = sbx_event_append(dfd, "paused", "running", why);
		if (!ret)
			broker_keep(r, name, dfd, uds);
		goto out;
	}
	if (st == SBX_ARCHIVED) {
		struct sbx_archive_stats as;

		ret = sbx_archive_unpack(dfd, &as, err, errlen);
		if (ret)
			goto out;
		sbx_event_append(dfd, "archived", "stopped", why);
		st = SBX_STOPPED;
	}
	if (st == SBX_DELETED) {
		ret = errmsg(err, errlen, -ENOTSUP, "%s is %s", name, sbx_state_name(st));
		goto out;
	}
	/*
	 * With a store, one host runs a sandbox: this one takes its lease first (and, taking it
	 * over, commits a generation naming it). cove-store said why on stderr when not.
	 */
	/* A template (built in its own root) is no sandbox of the store's: no lease, no follower.
	 */
	int ts = r->templates ? -1 : store_try_take(name);
	leased = false;
	if (ts > 0) {
		ret = ts == SBX_EXIT_HELD ? -EUSERS : -ENOLCK;
		if (errlen)
			err[0] = '\0';
		goto out;
	}
	/* Its keeper renews the lease from now on, while the VMM comes up and runs. */
	leased = ts == 0;
	if (leased)
		store_start_follower(dfd, name);
	spec = calloc(1, sizeof(*spec));
	args = calloc(1, sizeof(*args));
	if (!spec || !args) {
		ret = errmsg(err, errlen, -ENOMEM, "out of memory");
		goto out;
	}
	ret = sbx_spec_read(dfd, spec, err, errlen) ?: sbx_run_dir_make(r, name, err, errlen);
	if (ret)
		goto out;
	/*
	 * A policy: its broker runs beside the VM (a live one is reused) and grants a new epoch
	 * before the guest runs, so whatever token the guest held before is refused from now on.
	 */
	if (spec->policy[0]) {
		ret = sbx_broker_up(r, name, dfd, spec->policy, err, errlen)
			  ?: sbx_broker_grant(r, name, dfd, &grant, err, errlen);
		if (ret)
			goto out;
	}
	restore = has_chain(dfd);
	/*
	 * The chain as the host sees it, before any VMM runs on it: generations folded into
	 * chain.json, crashed commits' leftovers gone, then every recorded digest checked here,
	 * outside the jail, reading only files changed since the host last checked them (a file
	 * of the host's stamps). A mismatch is one line and nothing starts.
	 */
	bool checked = false;
	if (restore) {
		ret = sbx_chain_check(r, name, &checked, err, errlen);
		if (ret)
			goto out;
	}
	ret = restore ? sbx_args_restore(args, r, name, spec) : sbx_args_run(args, r, name, spec);
	if (!ret && checked)
		ret = sbx_args_append(args, "--digests-checked");
	/* Memory layers still arriving from the store: the VMM reads them through the fetcher. */
	bool lazy = restore && sbx_lazy_pending(dfd);
	if (!ret && lazy)
		ret = sbx_args_append(args, "--lazy-fd") ?: sbx_args_append(args, "4");
	if (ret) {
		errmsg(err, errlen, ret, "%s: the VMM's command line is too long", name);
		goto out;
	}
	if (restore && pipe2(ready, O_CLOEXEC) < 0) {
		ret = errmsg(err, errlen, -errno, "pipe: %s", strerror(errno));
		goto out;
	}
	if (lazy && socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, lazy_sv) < 0) {
		ret = errmsg(err, errlen, -errno, "socketpair: %s", strerror(errno));
		goto out;
	}
	if (lazy && (ret = store_start_lazy(dfd, name, lazy_sv[0]))) {
		errmsg(err, errlen, ret,
		       "%s: its memory layers are still arriving from the store, and the fetcher "
		       "could not start: %s",
		       name, ret == -ENOKEY ? "no store is configured here" : strerror(-ret));
		goto out;
	}
	ret = sbx_launch_lazy(dfd, args->argv, ready[1], lazy ? lazy_sv[1] : -1, &pid, err, errlen);
	if (ready[1] >= 0)
		close(ready[1]);
	if (ret)
		goto out;
	struct agent_machine m = {.hostname = name,
				  .machine_id = spec->machine_id[0] ? spec->machine_id : NULL};
	ret = wait_ready(dfd, pid, uds, ready[0], spec->policy[0] ? &grant : NULL, &m, err, errlen);
	if (ret) {
		/* Half started is not running: end it, so the next command starts it cleanly. */
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		goto out;
	}
	/* A fresh boot with a policy, or the first start of a new machine (made from a template:
	 * its broker made a CA of its own): the broker's CA into the guest's trust store (its own
	 * overlay), in place of the one there before. Not fatal: without it the guest's TLS to
	 * intercepted hosts fails, closed. */
	if (spec->policy[0] && (!restore || m.new_machine)) {
		char cerr[512];

		if (sbx_ca_install(dfd, uds, cerr, sizeof(cerr)))
			fprintf(stderr,
				"cove: warning: %s: the sandbox CA could not be installed in the "
				"guest (HTTPS to credential hosts will fail): %s\n",
				name, cerr);
	}
	/*
	 * A fresh boot writes its chain's base layer now, while the guest is quiet: every later
	 * stop then writes only what changed since, and the restore that follows copies those
	 * recently written pages (the ones the guest's next requests write again) in ahead
	 * instead of taking a copy-on-write fault on each. Not fatal: the first stop writes it.
	 */
	if (!restore) {
		char serr[512];

		if (sbx_snapshot_now(api, serr, sizeof(serr)))
			fprintf(stderr, "cove: warning: %s: no base snapshot yet: %s\n", name,
				serr);
	}
	ret = sbx_event_append(dfd, sbx_state_name(st), "running", why);
out:
	/* Taken but not started: released, so the follower ends and any host may start it. */
	if (ret && leased)
		store_try_release(name);
	if (ready[0] >= 0)
		close(ready[0]);
	for (int i = 0; i < 2; i++)
		if (lazy_sv[i] >= 0)
			close(lazy_sv[i]);
	explicit_bzero(&grant, sizeof(grant));
	free(spec);
	free(args);
	close(lk);
	return ret;
}

int sbx_snapshot_now(const char *api_sock, char *err, size_t errlen)
{
	char fault[256];

	for (int attempt = 0; attempt < 2; attempt++) {
		const char *body =
		    attempt ? "{\"snapshot_type\":\"Full\"}" : "{\"snapshot_type\":\"Diff\"}";
		char *reply = NULL;
		long status;
		int ret = api_call(api_sock, "PUT", "/snapshot/create", body, 3600, &status, &reply,
				   err, errlen);

		if (ret)
			return ret;
		api_fault_text(reply, fault, sizeof(fault));
		free(reply);
		if (status == 200)
			return 0;
		/* No base layer yet: the first one is full. */
		if (attempt == 0 && strstr(fault, "take a Full snapshot first"))
			continue;
		return errmsg(err, errlen, -EIO, "snapshot failed: %s", fault);
	}
	return -EIO;
}

int store_pull_absent(const char *name, bool *pulled)
{
	struct sbx_root r;
	struct stat sb;
	int ret = -1;

	*pulled = false;
	if (!store_is_configured() || sbx_name_check(name, NULL, 0) ||
	    sbx_root_open(&r, true, NULL, 0))
		return -1;
	if (fstatat(r.dfd, name, &sb, AT_SYMLINK_NOFOLLOW) < 0 && errno == ENOENT &&
	    sbx_tombstone_describe(&r, name, NULL, 0) != 0) {
		int ps = store_try_pull(name);
		ret = ps == SBX_EXIT_HELD || ps == 66 ? (ps == 66 ? SBX_EXIT_DELETED : ps) : -1;
		*pulled = ps == 0 && fstatat(r.dfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0;
		if (*pulled)
			ret = 0;
	}
	sbx_root_close(&r);
	return ret;
}

void sbx_cache_count(const struct sbx_root *r, int dfd, bool pulled)
{
	enum sbx_state st;

	if (!store_is_configured() || r->templates)
		return;
	/* A command on a running sandbox is no reconnect: it neither hits nor misses. */
	if (!pulled && (sbx_state_read(dfd, &st, NULL) || st == SBX_RUNNING))
		return;
	cache_stats_add(r->dfd, &(struct cache_stats){.hits = !pulled, .misses = pulled});
	/* And the sandbox's own (cove ls --json): a pulled copy's counters start with its miss. */
	store_stats_add(dfd, &(struct store_stats){.cache_hits = !pulled, .cache_misses = pulled});
}

int sbx_resolve(const char *sandbox, const char *why, char *uds, size_t len, char *err,
		size_t errlen)
{
	struct sbx_root r;
	int dfd, ret;
	bool pulled = false;

	if (strchr(sandbox, '/'))
		return agent_resolve(sandbox, uds, len, err, errlen) ? SBX_EXIT_UNKNOWN : 0;
	/* A host that has never made a sandbox has no state root; with a store, a pull makes it. */
	if (sbx_root_open(&r, store_is_configured() && sbx_name_check(sandbox, NULL, 0) == 0, NULL,
			  0) == 0) {
		dfd = sbx_dir_open(&r, sandbox, false, NULL, 0);
		/* A directory without a spec is not a sandbox `cove create` made. */
		if (dfd >= 0 && faccessat(dfd, SBX_SPEC, F_OK, AT_SYMLINK_NOFOLLOW) < 0) {
			close(dfd);
			dfd = -ENOENT;
		}
		/* Not on this host, nor removed here: the store, when one is configured, may
		 * hold it (another host made it); pulled, it starts as a stopped one does. */
		if (dfd < 0 && sbx_name_check(sandbox, NULL, 0) == 0 &&
		    sbx_tombstone_describe(&r, sandbox, NULL, 0) != 0) {
			int ps = store_try_pull(sandbox);
			if (ps == SBX_EXIT_HELD) {
				/* Running on another host (cove-store printed its JSON line). */
				sbx_root_close(&r);
				if (errlen)
					err[0] = '\0';
				return SBX_EXIT_HELD;
			}
			if (ps == 66) {
				sbx_root_close(&r);
				return errmsg(
				    err, errlen, SBX_EXIT_DELETED,
				    "sandbox %s was removed (its tombstone is in the store)",
				    sandbox);
			}
			if (ps >= 0)
				dfd = sbx_dir_open(&r, sandbox, false, NULL, 0);
			pulled = ps == 0 && dfd >= 0;
		}
		if (dfd >= 0) {
			sbx_cache_count(&r, dfd, pulled);
			ret = sbx_start(&r, sandbox, dfd, why, err, errlen);
			close(dfd);
			if (!ret && sbx_run_path(&r, sandbox, "vsock.sock", uds, len))
				ret = errmsg(err, errlen, -ENAMETOOLONG, "socket path too long");
			sbx_root_close(&r);
			if (ret == -ENOEXEC) {
				sbx_cpu_refused(sandbox, err && errlen ? err : "");
				if (errlen)
					err[0] = '\0';
				return SBX_EXIT_CPU;
			}
			return ret == -EUSERS ? SBX_EXIT_HELD : ret ? SBX_EXIT_START : 0;
		}
		ret = sbx_tombstone_describe(&r, sandbox, err, errlen);
		sbx_root_close(&r);
		if (ret == 0)
			return SBX_EXIT_DELETED;
	}
	/* Not one of ours: a socket some `cove run --vsock-uds` registered. */
	if (agent_resolve(sandbox, uds, len, err, errlen) == 0)
		return 0;
	if (sbx_name_check(sandbox, err, errlen))
		return SBX_EXIT_BAD_NAME;
	return SBX_EXIT_UNKNOWN;
}
