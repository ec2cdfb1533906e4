/*
 * Leases (lifecycle/store/lease.c) against the real radosgw that tests/lib/s3server.py starts:
 * conditional create and If-Match replace decide every race; no mock.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <libxml/parser.h>

#include "lifecycle/root.h"
#include "lifecycle/store/lease.h"
#include "lifecycle/store/lease_keeper.h"
#include "lifecycle/store/reconnect.h"
#include "lifecycle/tree.h"
#include "lifecycle/store/s3.h"
#include "lifecycle/store/store_config.h"

struct fx {
	struct store_config a, b; /* two hosts of one fleet: host ids differ */
	struct s3_client *ca, *cb;
	char name[32];
	char err[512];
};

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	assert_non_null(f);
	if (store_config_load(NULL, &f->a, f->err, sizeof(f->err)))
		fail_msg("store: %s", f->err);
	uint8_t key[32];
	assert_int_equal(getrandom(key, sizeof(key), 0), (ssize_t)sizeof(key));
	memcpy(f->a.fleet_key, key, 32);
	f->a.fleet_key_len = 32;
	f->a.lease_ttl_s = 10;
	f->a.clock_skew_s = 1;
	snprintf(f->a.prefix, sizeof(f->a.prefix), "lease-test/");
	f->b = f->a;
	strcpy(f->a.host_id, "host-a");
	strcpy(f->b.host_id, "host-b");
	if (s3_client_new(&f->a, &(struct s3_opts){0}, &f->ca, f->err, sizeof(f->err)) ||
	    s3_client_new(&f->b, &(struct s3_opts){0}, &f->cb, f->err, sizeof(f->err)))
		fail_msg("client: %s", f->err);
	uint32_t tag;
	assert_int_equal(getrandom(&tag, sizeof(tag), 0), (ssize_t)sizeof(tag));
	snprintf(f->name, sizeof(f->name), "lease-%08x", tag);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;
	s3_client_free(f->ca);
	s3_client_free(f->cb);
	store_config_wipe(&f->a);
	store_config_wipe(&f->b);
	free(f);
	return 0;
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Held by A; B is refused naming A; A renews and releases; B then takes it at the next epoch. */
static void test_take_renew_release(void **state)
{
	struct fx *f = *state;
	struct store_lease ha, hb, other;
	int64_t t = now_ms();
	assert_int_equal(
	    store_lease_take(f->ca, &f->a, f->name, 7, t, &ha, &other, f->err, sizeof(f->err)), 0);
	assert_string_equal(ha.host, "host-a");
	assert_int_equal(ha.epoch, 1);
	assert_int_equal(ha.generation, 7);
	assert_int_equal(
	    store_lease_take(f->cb, &f->b, f->name, 7, t, &hb, &other, f->err, sizeof(f->err)),
	    -EBUSY);
	assert_string_equal(other.host, "host-a");
	assert_non_null(strstr(f->err, "runs on host host-a"));
	char old_etag[sizeof(ha.etag)];
	memcpy(old_etag, ha.etag, sizeof(old_etag));
	assert_int_equal(store_lease_renew(f->ca, &f->a, &ha, t + 3000, f->err, sizeof(f->err)), 0);
	assert_int_equal(ha.expires_ms, t + 3000 + 10000);
	assert_string_not_equal(ha.etag, old_etag);
	/* Taking it again on the same host keeps the epoch (a restart here). */
	struct store_lease again;
	assert_int_equal(store_lease_take(f->ca, &f->a, f->name, 7, t + 4000, &again, &other,
					  f->err, sizeof(f->err)),
			 0);
	assert_int_equal(again.epoch, 1);
	assert_int_equal(store_lease_release(f->ca, &f->a, &again, f->err, sizeof(f->err)), 0);
	assert_int_equal(store_lease_take(f->cb, &f->b, f->name, 8, t + 5000, &hb, &other, f->err,
					  sizeof(f->err)),
			 0);
	assert_string_equal(hb.host, "host-b");
	assert_int_equal(hb.epoch, 2);
	/* A's old version is gone: its renewal names the new owner. */
	assert_int_equal(store_lease_renew(f->ca, &f->a, &ha, t + 6000, f->err, sizeof(f->err)),
			 -ESTALE);
	assert_non_null(strstr(f->err, "host host-b holds it"));
}

/* Expiry: B waits out the TTL plus the allowed skew, then takes it over (epoch + 1); A's
 * renewal is then refused by the store (If-Match on a version that is gone). */
static void test_expired_takeover(void **state)
{
	struct fx *f = *state;
	struct store_lease ha, hb, other;
	int64_t t = now_ms();
	assert_int_equal(
	    store_lease_take(f->ca, &f->a, f->name, 3, t, &ha, &other, f->err, sizeof(f->err)), 0);
	/* Expired, but within the skew: still A's. */
	assert_int_equal(store_lease_take(f->cb, &f->b, f->name, 3, t + 10500, &hb, &other, f->err,
					  sizeof(f->err)),
			 -EBUSY);
	assert_int_equal(store_lease_take(f->cb, &f->b, f->name, 3, t + 11500, &hb, &other, f->err,
					  sizeof(f->err)),
			 0);
	assert_int_equal(hb.epoch, ha.epoch + 1);
	assert_int_equal(store_lease_renew(f->ca, &f->a, &ha, t + 12000, f->err, sizeof(f->err)),
			 -ESTALE);
	assert_int_equal(store_lease_release(f->ca, &f->a, &ha, f->err, sizeof(f->err)), -ESTALE);
	struct store_lease now;
	assert_int_equal(store_lease_read(f->ca, &f->a, f->name, &now, f->err, sizeof(f->err)), 0);
	assert_string_equal(now.host, "host-b");
}

struct racer {
	struct s3_client *c;
	const struct store_config *cfg;
	const char *name;
	int64_t t;
	int r;
	struct store_lease held;
	char err[512];
};

static void *race(void *arg)
{
	struct racer *x = arg;
	struct store_lease other;
	x->r = store_lease_take(x->c, x->cfg, x->name, 1, x->t, &x->held, &other, x->err,
				sizeof(x->err));
	return NULL;
}

/* n racers, even ones host A's and odd ones host B's, each on a client of its own, started. */
static void racers_start(struct fx *f, struct racer *x, pthread_t *th, int n)
{
	int64_t t = now_ms();
	for (int i = 0; i < n; i++) {
		memset(&x[i], 0, sizeof(x[i]));
		x[i].cfg = i % 2 ? &f->b : &f->a;
		x[i].name = f->name;
		x[i].t = t;
		if (s3_client_new(x[i].cfg, &(struct s3_opts){0}, &x[i].c, f->err, sizeof(f->err)))
			fail_msg("client: %s", f->err);
	}
	for (int i = 0; i < n; i++)
		assert_int_equal(pthread_create(&th[i], NULL, race, &x[i]), 0);
}

/* Eight takers of a free lease at once, four per host, each on a client of its own: exactly
 * one host wins; the losers are told who holds it. */
static void test_race(void **state)
{
	struct fx *f = *state;
	enum { N = 8 };
	struct racer x[N];
	pthread_t th[N];
	racers_start(f, x, th, N);
	int won_a = 0, won_b = 0, busy = 0;
	for (int i = 0; i < N; i++) {
		pthread_join(th[i], NULL);
		if (x[i].r == 0)
			*(i % 2 ? &won_b : &won_a) += 1;
		else if (x[i].r == -EBUSY)
			busy++;
		else
			fail_msg("racer %d: %d %s", i, x[i].r, x[i].err);
		s3_client_free(x[i].c);
	}
	/* Same-host racers may share the win (a host's own lease, same epoch); never both hosts. */
	assert_true((won_a > 0) != (won_b > 0));
	assert_int_equal(won_a + won_b + busy, N);
	struct store_lease now;
	assert_int_equal(store_lease_read(f->ca, &f->a, f->name, &now, f->err, sizeof(f->err)), 0);
	assert_string_equal(now.host, won_a ? "host-a" : "host-b");
	assert_int_equal(now.epoch, 1);
}

/*
 * A released lease taken by eight racers at once, four per host, over and over: a change of
 * owner is an If-Match replace, and exactly one host may win each round, at exactly the next
 * epoch (the fencing token must never be handed out twice).
 */
static void test_race_released(void **state)
{
	struct fx *f = *state;
	enum { N = 8, ROUNDS = 12 };
	struct racer x[N];
	pthread_t th[N];
	struct store_lease held, other;
	assert_int_equal(store_lease_take(f->ca, &f->a, f->name, 1, now_ms(), &held, &other, f->err,
					  sizeof(f->err)),
			 0);
	assert_int_equal(store_lease_release(f->ca, &f->a, &held, f->err, sizeof(f->err)), 0);
	uint64_t epoch = held.epoch;
	for (int round = 0; round < ROUNDS; round++) {
		racers_start(f, x, th, N);
		int won_a = 0, won_b = 0, winner = -1;
		for (int i = 0; i < N; i++) {
			pthread_join(th[i], NULL);
			if (x[i].r == 0) {
				*(i % 2 ? &won_b : &won_a) += 1;
				winner = i;
				if (x[i].held.epoch != epoch + 1)
					fail_msg("round %d: racer %d holds epoch %llu, not %llu",
						 round, i, (unsigned long long)x[i].held.epoch,
						 (unsigned long long)(epoch + 1));
			} else if (x[i].r != -EBUSY) {
				fail_msg("round %d: racer %d: %d %s", round, i, x[i].r, x[i].err);
			}
		}
		if ((won_a > 0) == (won_b > 0))
			fail_msg("round %d: host A won %d takes and host B %d at epoch %llu", round,
				 won_a, won_b, (unsigned long long)(epoch + 1));
		struct store_lease now;
		assert_int_equal(
		    store_lease_read(f->ca, &f->a, f->name, &now, f->err, sizeof(f->err)), 0);
		assert_string_equal(now.host, won_a ? "host-a" : "host-b");
		assert_int_equal(now.epoch, epoch + 1);
		held = x[winner].held;
		assert_int_equal(
		    store_lease_release(x[winner].c, x[winner].cfg, &held, f->err, sizeof(f->err)),
		    0);
		epoch = held.epoch;
		for (int i = 0; i < N; i++)
			s3_client_free(x[i].c);
	}
}

/* A state root of its own for host `who` (COVE_STATE_DIR), holding an empty sandbox name. */
static void host_root(struct sbx_root *r, const char *who, const char *name)
{
	char dir[128], run[128];
	snprintf(dir, sizeof(dir), "/tmp/cove-owner-%s-%d", who, (int)getpid());
	snprintf(run, sizeof(run), "/tmp/cove-owner-%s-%d-run", who, (int)getpid());
	setenv("COVE_STATE_DIR", dir, 1);
	setenv("COVE_RUN_DIR", run, 1);
	char err[256];
	if (sbx_root_open(r, true, err, sizeof(err)))
		fail_msg("root: %s", err);
	int dfd = sbx_dir_open(r, name, true, err, sizeof(err));
	if (dfd < 0)
		fail_msg("sandbox dir: %s", err);
	close(dfd);
}

static int owner(struct fx *f, struct s3_client *c, const struct store_config *cfg,
		 const struct sbx_root *r)
{
	struct store_lease cur;
	return store_check_owner(c, cfg, r, f->name, &cur, f->err, sizeof(f->err));
}

static void record(const struct sbx_root *r, const char *name, const struct store_lease *l)
{
	int dfd = sbx_dir_open(r, name, false, NULL, 0);
	assert_true(dfd >= 0);
	assert_int_equal(store_lease_save(dfd, l), 0);
	close(dfd);
}

/*
 * cove gc's question (issue 30): may this host archive or delete its copy? Only while it holds
 * the lease or was the last to hold and release it; a host another one ran it after may not.
 */
static void test_owner(void **state)
{
	struct fx *f = *state;
	struct sbx_root ra, rb;
	host_root(&ra, "a", f->name);
	host_root(&rb, "b", f->name);
	struct store_lease ha, hb, other;
	/* Never leased: each copy is all there is. */
	assert_int_equal(owner(f, f->ca, &f->a, &ra), 0);
	assert_int_equal(store_lease_take(f->ca, &f->a, f->name, 1, now_ms(), &ha, &other, f->err,
					  sizeof(f->err)),
			 0);
	record(&ra, f->name, &ha);
	assert_int_equal(owner(f, f->ca, &f->a, &ra), 0);
	assert_int_equal(owner(f, f->cb, &f->b, &rb), -EBUSY);
	assert_non_null(strstr(f->err, "host-a holds its lease"));
	assert_int_equal(store_lease_release(f->ca, &f->a, &ha, f->err, sizeof(f->err)), 0);
	record(&ra, f->name, &ha);
	assert_int_equal(owner(f, f->ca, &f->a, &ra), 0); /* A released it last */
	assert_int_equal(owner(f, f->cb, &f->b, &rb), -EBUSY);
	/* B runs it (epoch 2) and releases it: now A's copy is the stale one. */
	assert_int_equal(store_lease_take(f->cb, &f->b, f->name, 1, now_ms(), &hb, &other, f->err,
					  sizeof(f->err)),
			 0);
	assert_int_equal(store_lease_release(f->cb, &f->b, &hb, f->err, sizeof(f->err)), 0);
	record(&rb, f->name, &hb);
	assert_int_equal(owner(f, f->cb, &f->b, &rb), 0);
	assert_int_equal(owner(f, f->ca, &f->a, &ra), -EBUSY);
	assert_non_null(strstr(f->err, "another host ran it since"));
	sbx_tree_remove(ra.dfd, f->name);
	sbx_tree_remove(rb.dfd, f->name);
	char cmd[4 * PATH_MAX + 16];
	snprintf(cmd, sizeof(cmd), "rm -rf %s %s %s %s", ra.state, ra.run, rb.state, rb.run);
	sbx_root_close(&ra);
	sbx_root_close(&rb);
	assert_int_equal(system(cmd), 0);
}

/* A lease written under another fleet key is refused, naming the MAC. */
static void test_foreign_lease(void **state)
{
	struct fx *f = *state;
	struct store_config other = f->a;
	memset(other.fleet_key, 0x5a, 32);
	struct store_lease l, o;
	assert_int_equal(
	    store_lease_take(f->ca, &other, f->name, 1, now_ms(), &l, &o, f->err, sizeof(f->err)),
	    0);
	assert_int_equal(
	    store_lease_take(f->ca, &f->a, f->name, 1, now_ms(), &l, &o, f->err, sizeof(f->err)),
	    -EBADMSG);
	assert_non_null(strstr(f->err, "bad MAC"));
}

/* What the keeper's set_paused hook saw. */
struct pause_log {
	pthread_mutex_t mu;
	int pauses, resumes;
	int64_t first_pause_ms;
};

static int record_pause(void *arg, bool paused)
{
	struct pause_log *p = arg;
	pthread_mutex_lock(&p->mu);
	if (paused && !p->pauses++)
		p->first_pause_ms = now_ms();
	p->resumes += !paused;
	pthread_mutex_unlock(&p->mu);
	return 0;
}

static struct pause_log pauses_now(struct pause_log *p)
{
	pthread_mutex_lock(&p->mu);
	struct pause_log out = *p;
	pthread_mutex_unlock(&p->mu);
	return out;
}

/* Removes the sandbox directory a keeper test made (its lease and stats files). */
static void empty_and_remove(int dfd, const char *dir)
{
	DIR *d = fdopendir(dfd);
	assert_non_null(d);
	struct dirent *e;
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			unlinkat(dirfd(d), e->d_name, 0);
	closedir(d);
	assert_int_equal(rmdir(dir), 0);
}

/* A lease host A takes now, and a sandbox directory (dir, a mkdtemp template) recording it, as
 * a follower's: its fd. */
static int held_lease_dir(struct fx *f, struct store_lease *held, char *dir)
{
	struct store_lease other;
	assert_int_equal(store_lease_take(f->ca, &f->a, f->name, 1, now_ms(), held, &other, f->err,
					  sizeof(f->err)),
			 0);
	assert_non_null(mkdtemp(dir));
	int dfd = open(dir, O_DIRECTORY | O_CLOEXEC);
	assert_true(dfd >= 0);
	assert_int_equal(store_lease_save(dfd, held), 0);
	return dfd;
}

static void keeper_init(struct fx *f, struct lease_keeper *k, struct store_config *cfg,
			const struct store_lease *held, int dfd, struct pause_log *p, int attempts)
{
	struct s3_opts o = {.max_attempts = attempts, .stall_timeout_s = 5};
	if (s3_client_new(cfg, &o, &k->c, f->err, sizeof(f->err)))
		fail_msg("keeper client: %s", f->err);
	k->cfg = cfg;
	k->dfd = dfd;
	k->held = *held;
	k->set_paused = record_pause;
	k->arg = p;
}

/*
 * The keeper pauses the VM by expiry - (skew + 3 s) even while a renewal hangs: here the
 * keeper's store is a socket that takes connections and never answers (a cut-off or stalled
 * store), so each renewal attempt blocks until the client's stall timeout, three times.
 */
static void test_keeper_pauses_while_renewal_hangs(void **state)
{
	struct fx *f = *state;
	int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(ls >= 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sa);
	assert_int_equal(bind(ls, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(ls, 16), 0);
	assert_int_equal(getsockname(ls, (struct sockaddr *)&sa, &sl), 0);
	struct store_config dead = f->a;
	snprintf(dead.endpoint, sizeof(dead.endpoint), "https://127.0.0.1:%u",
		 (unsigned)ntohs(sa.sin_port));

	struct store_lease held;
	char dir[] = "/tmp/cove-keeper-XXXXXX";
	int dfd = held_lease_dir(f, &held, dir);
	struct pause_log p = {.mu = PTHREAD_MUTEX_INITIALIZER};
	struct lease_keeper k = {0};
	keeper_init(f, &k, &dead, &held, dfd, &p, 1); /* one attempt already outlasts the margin */
	assert_int_equal(lease_keeper_start(&k), 0);
	const int64_t margin = ((int64_t)f->a.clock_skew_s + 3) * 1000;
	while (!pauses_now(&p).pauses && now_ms() < held.expires_ms + 5000)
		usleep(50 * 1000);
	struct pause_log seen = pauses_now(&p);
	lease_keeper_stop(&k);
	s3_client_free(k.c);
	assert_int_equal(seen.pauses, 1);
	assert_int_equal(seen.resumes, 0);
	/* Paused at expiry - margin, not once the hanging renewal gave up (about 15 s in). */
	if (seen.first_pause_ms < held.expires_ms - margin - 100 ||
	    seen.first_pause_ms > held.expires_ms - margin + 1500)
		fail_msg("paused %lld ms before expiry, want about %lld",
			 (long long)(held.expires_ms - seen.first_pause_ms), (long long)margin);
	assert_true(atomic_load(&k.paused));
	assert_false(atomic_load(&k.lost));
	close(ls);
	empty_and_remove(dfd, dir);
}

/* With a store that answers, the keeper renews ahead of the margin and never pauses. */
static void test_keeper_renews_without_pause(void **state)
{
	struct fx *f = *state;
	struct store_lease held;
	char dir[] = "/tmp/cove-keeper-XXXXXX";
	int dfd = held_lease_dir(f, &held, dir);
	struct pause_log p = {.mu = PTHREAD_MUTEX_INITIALIZER};
	struct lease_keeper k = {0};
	keeper_init(f, &k, &f->a, &held, dfd, &p, 3);
	assert_int_equal(lease_keeper_start(&k), 0);
	/* Past the first lease's pause point: only renewals keep it from pausing. */
	int64_t until = held.expires_ms + 1000;
	while (now_ms() < until)
		usleep(100 * 1000);
	lease_keeper_stop(&k);
	s3_client_free(k.c);
	struct pause_log seen = pauses_now(&p);
	assert_int_equal(seen.pauses, 0);
	struct store_lease saved;
	assert_int_equal(store_lease_load(dfd, &saved), 0);
	if (saved.expires_ms <= held.expires_ms)
		fail_msg("the keeper never renewed: expiry %lld, first %lld",
			 (long long)saved.expires_ms, (long long)held.expires_ms);
	assert_int_equal(saved.epoch, held.epoch);
	empty_and_remove(dfd, dir);
}

int main(void)
{
	curl_global_init(CURL_GLOBAL_DEFAULT);
	xmlInitParser();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_take_renew_release, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_expired_takeover, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_race, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_race_released, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_owner, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_foreign_lease, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_keeper_pauses_while_renewal_hangs, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_keeper_renews_without_pause, setup, teardown),
	};
	int r = cmocka_run_group_tests(tests, NULL, NULL);
	xmlCleanupParser();
	curl_global_cleanup();
	return r;
}
