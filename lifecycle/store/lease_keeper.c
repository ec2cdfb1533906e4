/* Keeps a held lease alive beside a running sandbox (lease_keeper.h, LEASE.md). */
#include "lifecycle/store/lease_keeper.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "lifecycle/launch.h"
#include "lifecycle/store_stats.h"

/* Waits up to ms on the keeper's condition; true when asked to stop. */
static bool nap(struct lease_keeper *k, int64_t ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000)
		ts.tv_sec++, ts.tv_nsec -= 1000000000;
	pthread_mutex_lock(&k->mu);
	while (!k->stop && pthread_cond_timedwait(&k->cv, &k->mu, &ts) != ETIMEDOUT)
		;
	bool stop = k->stop;
	pthread_mutex_unlock(&k->mu);
	return stop;
}

bool lease_keeper_current(const struct lease_keeper *k)
{
	struct store_lease now;
	if (store_lease_load(k->dfd, &now))
		return false;
	return now.epoch == k->held.epoch && !strcmp(now.host, k->held.host) && now.expires_ms;
}

/* Pauses the VM once the held lease is within the margin of expiring (called under mu). */
static void pause_now(struct lease_keeper *k)
{
	int64_t asked = k->held.expires_ms - realtime_ms();
	int pr = k->set_paused(k->arg, true);
	atomic_store(&k->paused, true);
	/* Both times: the pause is asked for at the margin; a loaded host can take a while to
	 * carry it out, and LEASE.md's rule 2 needs it done before expiry + skew. */
	log_err(k->log,
		"%s: the lease could not be renewed and expires in %lld ms: VM %s (asked %lld ms "
		"before expiry), no commit until it is renewed",
		k->held.sandbox, (long long)(k->held.expires_ms - realtime_ms()),
		pr ? "NOT paused (its API did not answer)" : "paused", (long long)asked);
}

/*
 * The guard: a thread of its own that sleeps until the held lease's expiry minus the margin and
 * pauses the VM then, unless a renewal moved the expiry first. A renewal can take longer than
 * the margin (retries, a store that does not answer), so the pause never waits on it.
 */
static void *guard_main(void *arg)
{
	struct lease_keeper *k = arg;
	pthread_mutex_lock(&k->mu);
	while (!k->stop) {
		int64_t left = k->held.expires_ms - k->margin_ms - realtime_ms();
		if (left <= 0 && !atomic_load(&k->paused) && !atomic_load(&k->lost)) {
			pause_now(k);
			continue;
		}
		if (left <= 0) {
			/* paused or lost: nothing to do until a renewal or the stop */
			pthread_cond_wait(&k->cv, &k->mu);
			continue;
		}
		/* Wake at least every second: the wall clock can move under a monotonic wait. */
		if (left > 1000)
			left = 1000;
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += left / 1000;
		ts.tv_nsec += (left % 1000) * 1000000;
		if (ts.tv_nsec >= 1000000000)
			ts.tv_sec++, ts.tv_nsec -= 1000000000;
		pthread_cond_timedwait(&k->cv, &k->mu, &ts);
	}
	pthread_mutex_unlock(&k->mu);
	return NULL;
}

/* The renewer: renews every third of the time to live, and every second while paused. */
static void *keeper_main(void *arg)
{
	struct lease_keeper *k = arg;
	const int64_t ttl = (int64_t)k->cfg->lease_ttl_s * 1000;
	int64_t last_ok = realtime_ms();
	char why[512];
	do {
		int64_t now = realtime_ms();
		/* Every third of the time to live, counted from the last renewal or from when the
		 * lease was written (a start may hand it over a while after taking it). Only this
		 * thread writes held, so it reads it unlocked. */
		if (now - last_ok < ttl / 3 && now < k->held.expires_ms - 2 * ttl / 3 &&
		    !atomic_load(&k->paused))
			continue;
		struct store_lease next = k->held;
		int r = store_lease_renew(k->c, k->cfg, &next, now, why, sizeof(why));
		store_stats_add(k->dfd, &(struct store_stats){.renewals = !r,
							      .renewal_failures = r != 0,
							      .leases_lost = r == -ESTALE});
		if (!r) {
			pthread_mutex_lock(&k->mu);
			k->held = next;
			last_ok = now;
			if (lease_keeper_current(k))
				store_lease_save(k->dfd, &next);
			if (atomic_load(&k->paused) && !k->set_paused(k->arg, false)) {
				atomic_store(&k->paused, false);
				log_warn(k->log, "%s: lease renewed: the VM runs again",
					 k->held.sandbox);
			}
			pthread_cond_broadcast(&k->cv);
			pthread_mutex_unlock(&k->mu);
		} else if (r == -ESTALE) {
			/* Another host holds it now: this copy must not go on. */
			atomic_store(&k->lost, true);
			if (!lease_keeper_current(k)) {
				log_info(k->log,
					 "%s: %s; a later start on this host holds its own lease: "
					 "this keeper ends",
					 k->held.sandbox, why);
				break;
			}
			pid_t pid = atomic_load(&k->vmm);
			if (pid <= 0)
				pid = sbx_vmm_pid(k->dfd);
			log_err(k->log, "%s: %s; ending this host's VM (pid %d)", k->held.sandbox,
				why, (int)pid);
			if (pid > 0)
				kill(pid, SIGKILL);
			break;
		} else {
			log_warn(k->log, "%s: lease renewal failed (tried again): %s",
				 k->held.sandbox, why);
		}
	} while (!nap(k, 1000));
	return NULL;
}

int lease_keeper_start(struct lease_keeper *k)
{
	atomic_init(&k->paused, false);
	atomic_init(&k->lost, false);
	atomic_init(&k->vmm, 0);
	k->stop = false;
	k->margin_ms = ((int64_t)k->cfg->clock_skew_s + 3) * 1000;
	pthread_mutex_init(&k->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&k->cv, &ca);
	pthread_condattr_destroy(&ca);
	int r = pthread_create(&k->guard, NULL, guard_main, k);
	if (!r) {
		r = pthread_create(&k->thread, NULL, keeper_main, k);
		if (r) {
			pthread_mutex_lock(&k->mu);
			k->stop = true;
			pthread_cond_broadcast(&k->cv);
			pthread_mutex_unlock(&k->mu);
			pthread_join(k->guard, NULL);
		}
	}
	if (r) {
		pthread_cond_destroy(&k->cv);
		pthread_mutex_destroy(&k->mu);
	}
	return -r;
}

void lease_keeper_stop(struct lease_keeper *k)
{
	pthread_mutex_lock(&k->mu);
	k->stop = true;
	pthread_cond_broadcast(&k->cv);
	pthread_mutex_unlock(&k->mu);
	pthread_join(k->thread, NULL);
	pthread_join(k->guard, NULL);
	pthread_cond_destroy(&k->cv);
	pthread_mutex_destroy(&k->mu);
}
