/* A running sandbox's commits uploaded as they come (reconnect.h: store_follow). */
#include "lifecycle/store/reconnect.h"
#include "lifecycle/store/lazy_blob.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/errmsg.h"
#include "lifecycle/launch.h"
#include "lifecycle/lock.h"
#include "lifecycle/spec.h"
#include "lifecycle/vmm_args.h"
#include "lifecycle/image_files.h"
#include "lifecycle/store/lease_keeper.h"
#include "lifecycle/store/store_config.h"
#include "snapshot/chain.h"

#define FOLLOW_TICK_MS	    2000
#define FOLLOW_START_WAIT_S 900

/* The chain's newest valid generation number (0: none yet). */
static uint64_t newest_commit(const char *dir)
{
	struct chain *c = calloc(1, sizeof(*c));
	uint64_t g = 0;
	char err[256];
	if (c && chain_load(dir, c, err, sizeof(err)) == 0 && chain_latest(c))
		g = c->gen ? c->gen : 1;
	free(c);
	return g;
}

/* With a lease this host holds: its keeper thread, on a client of its own. 0: none held. */
static int keeper_up(const struct store_config *cfg, int dfd, struct logger *log,
		     const struct store_follow_hooks *h, struct lease_keeper *k, char *err,
		     size_t errlen)
{
	struct store_lease l;
	if (store_lease_load(dfd, &l) || strcmp(l.host, cfg->host_id) || !l.expires_ms)
		return 0;
	struct s3_opts o = {.log = log, .max_attempts = 3, .stall_timeout_s = 5};
	int r = s3_client_new(cfg, &o, &k->c, err, errlen);
	if (r)
		return r;
	k->cfg = cfg;
	k->dfd = dfd;
	k->held = l;
	k->log = log;
	k->set_paused = h->set_paused;
	k->arg = h->arg;
	r = lease_keeper_start(k);
	if (r) {
		s3_client_free(k->c);
		k->c = NULL;
		return errmsg(err, errlen, r, "lease keeper thread: %s", strerror(-r));
	}
	return 1;
}

int store_follow(struct s3_client *c, const struct store_config *cfg, const struct sbx_root *root,
		 const char *name, struct logger *log, const struct store_follow_hooks *hooks,
		 char *err, size_t errlen)
{
	if (!cfg->fleet_key_len)
		return errmsg(err, errlen, -ENOKEY, "store.json names no fleet_key_file");
	int dfd = sbx_dir_open(root, name, false, err, errlen);
	if (dfd < 0)
		return dfd;
	/*
	 * The lease is renewed from now on, before anything else: a former run's follower may
	 * still be finishing its last upload (below), and a lease's time to live is shorter.
	 */
	struct lease_keeper *k = calloc(1, sizeof(*k));
	int leased = !k ? -ENOMEM : keeper_up(cfg, dfd, log, hooks, k, err, errlen);
	if (leased < 0) {
		free(k);
		close(dfd);
		return leased;
	}
	/* One follower per sandbox: a former run's, finishing its last upload, goes first. */
	int lk = sbx_lock_take(dfd, STORE_FOLLOW_LOCK, true, false);
	if (lk < 0) {
		if (leased > 0) {
			lease_keeper_stop(k);
			s3_client_free(k->c);
		}
		free(k);
		close(dfd);
		return errmsg(err, errlen, lk, "%s: %s", STORE_FOLLOW_LOCK, strerror(-lk));
	}
	struct sbx_spec *spec = calloc(1, sizeof(*spec));
	const char *policy = "";
	int r = spec ? sbx_spec_read(dfd, spec, err, errlen) : -ENOMEM;
	if (!r)
		r = store_policy_id_of(cfg, spec->policy, &policy, err, errlen);
	char chain_dir[PATH_MAX + 64];
	snprintf(chain_dir, sizeof(chain_dir), "%s/%s/" SBX_CHAIN, root->state, name);
	int in = r ? -1 : inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
	if (in >= 0)
		(void)inotify_add_watch(in, chain_dir, IN_CREATE | IN_MOVED_TO);
	int sdfd = -1;
	if (!r) {
		if (mkdirat(root->dfd, STORE_STAGE_DIR, 0700) < 0 && errno != EEXIST)
			r = errmsg(err, errlen, -errno, "%s: %s", STORE_STAGE_DIR, strerror(errno));
		else if ((sdfd = openat(root->dfd, STORE_STAGE_DIR, O_RDONLY | O_DIRECTORY)) < 0)
			r = errmsg(err, errlen, -errno, "%s: %s", STORE_STAGE_DIR, strerror(errno));
	}
	struct store_upload_cache cache = {0};
	struct store_keyring kr = {cfg->fleet_key, cfg->fleet_key_len};
	uint64_t done = 0, base = 0;
	store_base_load(dfd, &base);
	/*
	 * Started as soon as the lease is taken, before the VMM runs (a restore can outlast a
	 * lease's time to live): the keeper renews while the VMM comes up. A start that failed
	 * releases the lease (or leaves no VMM): then this follower ends.
	 */
	pid_t vmm = 0;
	for (int i = 0; !r && i < FOLLOW_START_WAIT_S * 10; i++) {
		if ((vmm = sbx_vmm_pid(dfd)) > 0 || (leased > 0 && !lease_keeper_current(k)))
			break;
		usleep(100 * 1000);
	}
	if (leased > 0)
		atomic_store(&k->vmm, vmm);
	char stamps[PATH_MAX + 96], image_json[PATH_MAX + 96];
	snprintf(stamps, sizeof(stamps), "%s/%s/" SBX_DIGEST_STAMPS, root->state, name);
	snprintf(image_json, sizeof(image_json), "%s/%s/" SBX_IMAGE_JSON, root->state, name);
	/*
	 * Until its VMM is gone (a stopped one's final generation is cove stop's push). Only that
	 * VMM: a later start on this host has a follower (and a lease record) of its own.
	 */
	while (!r && vmm > 0 && sbx_vmm_pid(dfd) == vmm) {
		if (leased > 0 && (atomic_load(&k->lost) || !lease_keeper_current(k)))
			break;
		uint64_t g = newest_commit(chain_dir);
		/* No commit while the lease is in doubt: the VM is paused, the chain waits. */
		if (g && g != done && !(leased && atomic_load(&k->paused))) {
			struct store_upload_src src = {.name = name,
						       .chain_dir = chain_dir,
						       .spec = spec,
						       .image_json = image_json,
						       .policy_id = policy,
						       .key_type = store_key_type_of(spec->key),
						       .stage_dfd = sdfd,
						       .cache = &cache,
						       .fenced = leased > 0,
						       .base = base,
						       .lease = leased > 0 ? k->held.epoch : 0};
			struct store_file *lz = NULL;
			src.nr_lazy = lazy_upload_files(dfd, &lz);
			src.lazy = lz;
			src.stamps = stamps;
			struct store_sync_stats st;
			char why[512];
			int u = store_upload_generation(c, &src, &kr, &st, why, sizeof(why));
			free(lz);
			store_stats_note_upload(dfd, u, &st);
			if (u == -EIDRM) {
				r = errmsg(err, errlen, u, "%s", why);
				break;
			}
			if (u == -ESTALE) {
				/* Fenced: the new owner committed this number first. */
				if (sbx_vmm_pid(dfd) == vmm)
					kill(vmm, SIGKILL);
				r = errmsg(err, errlen, u, "%s; this host's VM ended", why);
				break;
			}
			if (!u && leased > 0) {
				base = st.generation;
				store_base_save(dfd, base);
			}
			if (u) {
				log_warn(log, "%s: commit %llu not uploaded yet (tried again): %s",
					 name, (unsigned long long)g, why);
			} else {
				done = g;
				log_info(
				    log,
				    "%s: commit %llu is generation %llu: %llu blobs sent (%llu "
				    "bytes), %llu unchanged",
				    name, (unsigned long long)g, (unsigned long long)st.generation,
				    (unsigned long long)st.blobs_sent,
				    (unsigned long long)st.bytes_sent,
				    (unsigned long long)st.blobs_present);
			}
		}
		struct pollfd p = {.fd = in, .events = POLLIN};
		if (poll(&p, in >= 0 ? 1 : 0, FOLLOW_TICK_MS) > 0) {
			char buf[4096];
			while (read(in, buf, sizeof(buf)) > 0)
				; /* drained: the next round reads the chain itself */
		}
	}
	if (leased > 0) {
		lease_keeper_stop(k);
		s3_client_free(k->c);
	}
	free(k);
	store_upload_cache_free(&cache);
	if (in >= 0)
		close(in);
	if (sdfd >= 0)
		close(sdfd);
	free(spec);
	close(lk);
	close(dfd);
	return r;
}
