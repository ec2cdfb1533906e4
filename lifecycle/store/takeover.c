/* Taking a sandbox's lease before it starts here, and releasing it after (reconnect.h). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/errmsg.h"
#include "lifecycle/store/lease.h"
#include "lifecycle/store/lease_keeper.h"
#include "lifecycle/store/reconnect.h"
#include "lifecycle/store_stats.h"

/* Rounds of "read the newest, fetch it if newer, commit the next" a take tries (below). */
#define TAKE_COMMIT_ROUNDS 3

/* A take has no VM yet: nothing for its keeper to pause. */
static int no_vm(void *arg, bool paused)
{
	(void)arg;
	(void)paused;
	return 0;
}

/* The lease still this take's: renewed in time, not moved on. */
static bool still_held(struct lease_keeper *k)
{
	return !atomic_load(&k->paused) && !atomic_load(&k->lost) && lease_keeper_current(k);
}

/*
 * With the lease held (its keeper renewing it: a fetch can outlast the time to live): the
 * store's newest generation read now, not before the take (a former owner may have committed
 * and released in between), fetched when newer than this host's copy, then newest + 1
 * committed naming the lease. A former owner's late commit of that number (its follower, not
 * yet told) wins one race at most: read again, but only while the lease is still this one's.
 * A take whose lease lapsed never commits: the host that took it next committed first.
 */
static int commit_taken(struct s3_client *c, const struct store_config *cfg,
			const struct sbx_root *root, const char *name, int dfd, uint64_t base,
			struct lease_keeper *k, bool must_commit, char *err, size_t errlen)
{
	int r = -ESTALE;
	for (int round = 0; round < TAKE_COMMIT_ROUNDS && r == -ESTALE; round++) {
		uint64_t newest = 0;
		struct store_sync_stats st;
		r = store_newest_generation(c, name, &newest, err, errlen);
		/* A copy older than the store's newest (another host ran it since): never run
		 * the old one. The newest is fetched in its place. */
		if (!r && newest > base) {
			r = store_refresh_sandbox(c, cfg, root, name, dfd, newest, &st, err, errlen);
			if (!r)
				base = newest;
			must_commit = must_commit || !r;
		}
		if (r || !newest || !must_commit)
			break;
		if (!still_held(k))
			return errmsg(err, errlen, -ETIMEDOUT,
				      "sandbox %s: its lease lapsed while this host took it (the "
				      "store out of reach or too slow): not started",
				      name);
		r = store_upload_stopped(c, cfg, root, name, dfd, true, newest, k->held.epoch,
					 &st, err, errlen);
		if (!r)
			r = store_base_save(dfd, st.generation);
	}
	if (r == -ESTALE)
		r = errmsg(err, errlen, -EAGAIN,
			   "sandbox %s: generations kept arriving after this host took its lease "
			   "(%d rounds): not started",
			   name, TAKE_COMMIT_ROUNDS);
	return r;
}

int store_take_sandbox(struct s3_client *c, const struct store_config *cfg,
		       const struct sbx_root *root, const char *name, struct logger *log,
		       struct store_lease *other, char *err, size_t errlen)
{
	int dfd = sbx_dir_open(root, name, false, err, errlen);
	if (dfd < 0)
		return dfd;
	uint64_t base = 0, seen = 0;
	int r = store_base_load(dfd, &base);
	if (r == -ENOENT)
		r = 0;
	else if (r)
		r = errmsg(err, errlen, r, "%s/%s: %s", name, STORE_BASE_FILE, strerror(-r));
	/* What the lease records it started from; commit_taken reads it again once held. */
	if (!r)
		r = store_newest_generation(c, name, &seen, err, errlen);
	struct store_lease prev, held;
	bool had = store_lease_load(dfd, &prev) == 0;
	if (!r)
		r = store_lease_take(c, cfg, name, seen, realtime_ms(), &held, other, err, errlen);
	if (r) {
		close(dfd);
		return r;
	}
	/* Renewed from now on, by a keeper on a client of its own, until the follower's. */
	struct lease_keeper *k = calloc(1, sizeof(*k));
	struct s3_opts o = {.log = log, .max_attempts = 3, .stall_timeout_s = 5};
	bool kept = false;
	if (!k)
		r = errmsg(err, errlen, -ENOMEM, "out of memory");
	else if (store_lease_save(dfd, &held))
		r = errmsg(err, errlen, -EIO, "%s: cannot record its lease", name);
	else if (!(r = s3_client_new(cfg, &o, &k->c, err, errlen))) {
		*k = (struct lease_keeper){
		    .c = k->c, .cfg = cfg, .dfd = dfd, .held = held, .log = log, .set_paused = no_vm};
		r = lease_keeper_start(k);
		kept = !r;
		if (r) {
			s3_client_free(k->c);
			r = errmsg(err, errlen, r, "lease keeper thread: %s", strerror(-r));
		}
	}
	/*
	 * A new owner (or a new epoch) commits newest + 1 naming this lease before the guest
	 * runs: a former owner's late commit of that number is then refused by the store. Not
	 * when this host released it last and nobody held it since (the next epoch).
	 */
	bool ours_since =
	    had && (prev.epoch == held.epoch || (!prev.host[0] && prev.epoch + 1 == held.epoch));
	if (!r)
		r = commit_taken(c, cfg, root, name, dfd, base, k, !ours_since, err, errlen);
	if (kept) {
		lease_keeper_stop(k);
		s3_client_free(k->c);
		held = k->held; /* its newest renewal, recorded already */
		if (!r && !still_held(k))
			r = errmsg(err, errlen, -ETIMEDOUT,
				   "sandbox %s: its lease lapsed while this host took it: not "
				   "started",
				   name);
	}
	free(k);
	if (!r)
		store_stats_add(dfd, &(struct store_stats){.takeovers = !ours_since});
	if (r) {
		char why[256];
		store_lease_release(c, cfg, &held, why, sizeof(why));
		store_lease_save(dfd, &held);
	}
	close(dfd);
	return r;
}

int store_release_sandbox(struct s3_client *c, const struct store_config *cfg,
			  const struct sbx_root *root, const char *name, char *err, size_t errlen)
{
	int dfd = sbx_dir_open(root, name, false, err, errlen);
	if (dfd < 0)
		return dfd;
	struct store_lease held;
	int r = 0;
	if (store_lease_load(dfd, &held) == 0 && !strcmp(held.host, cfg->host_id) &&
	    held.expires_ms) {
		r = store_lease_release(c, cfg, &held, err, errlen);
		if (!r)
			store_lease_save(dfd, &held);
	}
	close(dfd);
	return r;
}

int store_check_held(const struct store_config *cfg, const struct sbx_root *root, const char *name,
		     int64_t now_ms, struct store_lease *held, char *err, size_t errlen)
{
	int dfd = sbx_dir_open(root, name, false, err, errlen);
	if (dfd < 0)
		return dfd;
	int r = store_lease_load(dfd, held);
	close(dfd);
	if (r == -ENOENT)
		return 0;
	if (r)
		return errmsg(err, errlen, r, "%s/%s: %s", name, STORE_LEASE_FILE, strerror(-r));
	const int64_t margin = ((int64_t)cfg->clock_skew_s + 3) * 1000;
	if (!strcmp(held->host, cfg->host_id) && held->expires_ms - margin > now_ms)
		return 0;
	return errmsg(
	    err, errlen, -EBUSY,
	    "sandbox %s: its lease is in doubt here (%s, epoch %llu): the VM stays paused "
	    "until this host renews it",
	    name,
	    !held->host[0]		       ? "released"
	    : strcmp(held->host, cfg->host_id) ? "another host's"
	    : held->expires_ms > now_ms	       ? "not renewed in time"
					       : "expired",
	    (unsigned long long)held->epoch);
}

int store_check_owner(struct s3_client *c, const struct store_config *cfg,
		      const struct sbx_root *root, const char *name, struct store_lease *cur,
		      char *err, size_t errlen)
{
	struct store_lease mine;
	int dfd = sbx_dir_open(root, name, false, err, errlen);
	if (dfd < 0)
		return dfd;
	bool had = store_lease_load(dfd, &mine) == 0;
	close(dfd);
	int r = store_lease_read(c, cfg, name, cur, err, errlen);
	if (r == -ENOENT)
		return 0; /* never leased: the copy here is all there is */
	if (r)
		return r;
	if (!strcmp(cur->host, cfg->host_id))
		return 0;
	/* Released at the epoch this host held: this host released it, nobody took it since. */
	if (!cur->host[0] && had && mine.epoch == cur->epoch)
		return 0;
	if (cur->host[0])
		return errmsg(err, errlen, -EBUSY,
			      "sandbox %s: host %s holds its lease (epoch %llu)", name, cur->host,
			      (unsigned long long)cur->epoch);
	return errmsg(
	    err, errlen, -EBUSY,
	    "sandbox %s: another host ran it since this host did (the store's lease is at "
	    "epoch %llu, this host's at %llu)",
	    name, (unsigned long long)cur->epoch, had ? (unsigned long long)mine.epoch : 0ULL);
}
