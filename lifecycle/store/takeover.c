/* Taking a sandbox's lease before it starts here, and releasing it after (reconnect.h). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/errmsg.h"
#include "lifecycle/store/lease.h"
#include "lifecycle/store/reconnect.h"
#include "lifecycle/store_stats.h"

int store_take_sandbox(struct s3_client *c, const struct store_config *cfg,
		       const struct sbx_root *root, const char *name, struct store_lease *other,
		       char *err, size_t errlen)
{
	int dfd = sbx_dir_open(root, name, false, err, errlen);
	if (dfd < 0)
		return dfd;
	uint64_t base = 0, newest = 0;
	int r = store_base_load(dfd, &base);
	if (r == -ENOENT)
		r = 0;
	else if (r)
		r = errmsg(err, errlen, r, "%s/%s: %s", name, STORE_BASE_FILE, strerror(-r));
	if (!r)
		r = store_newest_generation(c, name, &newest, err, errlen);
	struct store_lease prev, held;
	bool had = store_lease_load(dfd, &prev) == 0;
	if (!r)
		r = store_lease_take(c, cfg, name, newest, realtime_ms(), &held, other, err,
				     errlen);
	/*
	 * A copy older than the store's newest (another host ran it since): never run the old
	 * one. The newest is fetched in its place, now that no other host can commit.
	 */
	if (!r && newest > base) {
		struct store_sync_stats st;
		r = store_refresh_sandbox(c, cfg, root, name, dfd, newest, &st, err, errlen);
		if (r) {
			char why[256];
			store_lease_release(c, cfg, &held, why, sizeof(why));
		}
	}
	if (!r && store_lease_save(dfd, &held))
		r = errmsg(err, errlen, -EIO, "%s: cannot record its lease", name);
	/*
	 * A new owner (or a new epoch): commit newest + 1 naming this lease before the guest
	 * runs. A former owner's late commit of that number is then refused by the store.
	 */
	/* Not when this host released it last and nobody held it since (the next epoch). */
	bool ours_since =
	    had && (prev.epoch == held.epoch || (!prev.host[0] && prev.epoch + 1 == held.epoch));
	if (!r && newest && !ours_since) {
		struct store_sync_stats st;
		r = store_upload_stopped(c, cfg, root, name, dfd, true, newest, held.epoch, &st,
					 err, errlen);
		if (!r)
			r = store_base_save(dfd, st.generation);
		if (!r)
			store_stats_add(dfd, &(struct store_stats){.takeovers = 1});
		if (r) {
			char why[256];
			store_lease_release(c, cfg, &held, why, sizeof(why));
			store_lease_save(dfd, &held);
		}
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
