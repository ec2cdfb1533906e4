/* Named sandboxes pushed to and pulled from the store (reconnect.h). */
#include "lifecycle/store/reconnect.h"
#include "lifecycle/template.h"
#include "lifecycle/store/lazy_blob.h"
#include "lifecycle/store_stats.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "lifecycle/image_files.h"
#include "lifecycle/lazy_files.h"
#include "lifecycle/lock.h"
#include "lifecycle/store/lease.h"
#include "common/clock.h"
#include "lifecycle/spec.h"
#include "lifecycle/state.h"
#include "lifecycle/tree.h"
#include "lifecycle/vmm_args.h"
#include "lifecycle/store/store_config.h"

/* A directory beneath the root (made 0700 when absent): its fd, or -errno. */
static int root_subdir(const struct sbx_root *root, const char *name, char *err, size_t errlen)
{
	if (mkdirat(root->dfd, name, 0700) < 0 && errno != EEXIST)
		return errmsg(err, errlen, -errno, "%s/%s: %s", root->state, name, strerror(errno));
	int fd = openat(root->dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	return fd < 0 ? errmsg(err, errlen, -errno, "%s/%s: %s", root->state, name, strerror(errno))
		      : fd;
}

/* The provider type of a --key spec ("key-cmd:..." or "pkcs11:..."), "" for none. */
const char *store_key_type_of(const char *spec)
{
	if (!spec[0])
		return "";
	return !strncmp(spec, "pkcs11:", 7) ? "pkcs11" : "key-cmd";
}

int store_policy_id_of(const struct store_config *cfg, const char *path, const char **id, char *err,
		       size_t errlen)
{
	*id = "";
	if (!path[0])
		return 0;
	for (int i = 0; i < cfg->nr_policies; i++)
		if (!strcmp(cfg->policies[i].path, path)) {
			*id = cfg->policies[i].id;
			return 0;
		}
	return errmsg(err, errlen, -ENOENT,
		      "the sandbox's policy %s is not in store.json's \"policies\": another host "
		      "could not map it to a policy of its own",
		      path);
}

/* The store's name of `name` beneath root (sync.h): "@T" for a template, else itself. */
static void store_name_of(const struct sbx_root *root, const char *name, char *out, size_t cap)
{
	snprintf(out, cap, "%s%s", root->templates ? "@" : "", name);
}

int store_push_sandbox(struct s3_client *c, const struct store_config *cfg,
		       const struct sbx_root *root, const char *name, struct store_sync_stats *st,
		       char *err, size_t errlen)
{
	if (!cfg->fleet_key_len)
		return errmsg(err, errlen, -ENOKEY, "store.json names no fleet_key_file");
	int dfd = sbx_dir_open(root, name, false, err, errlen);
	if (dfd < 0)
		return dfd;
	int lk = sbx_lock_take(dfd, SBX_LOCK_START, false, false), r = 0;
	enum sbx_state state;
	if (lk < 0)
		r = errmsg(err, errlen, -EBUSY, "sandbox %s is being started or stopped", name);
	/* A crashed one's chain holds only whole commits, as a stopped one's does. */
	if (!r &&
	    (sbx_state_read(dfd, &state, NULL) || (state != SBX_STOPPED && state != SBX_CRASHED)))
		r = errmsg(err, errlen, -EBUSY,
			   "sandbox %s is not stopped: push uploads a stopped (or crashed) sandbox",
			   name);
	struct store_lease held;
	bool leased = !r && store_lease_load(dfd, &held) == 0 && !strcmp(held.host, cfg->host_id) &&
		      held.expires_ms;
	uint64_t base = 0;
	if (leased) {
		/* The follower may still be committing the last periodic snapshot: after it. */
		int fl = sbx_lock_take(dfd, STORE_FOLLOW_LOCK, true, false);
		store_base_load(dfd, &base);
		r = store_lease_renew(c, cfg, &held, realtime_ms(), err, errlen);
		if (!r)
			store_lease_save(dfd, &held);
		if (fl >= 0)
			close(fl);
	}
	if (!r)
		r = store_upload_stopped(c, cfg, root, name, dfd, leased, base,
					 leased ? held.epoch : 0, st, err, errlen);
	if (!r && leased)
		store_base_save(dfd, st->generation);
	if (lk >= 0)
		close(lk);
	close(dfd);
	return r;
}

int store_upload_stopped(struct s3_client *c, const struct store_config *cfg,
			 const struct sbx_root *root, const char *name, int dfd, bool fenced,
			 uint64_t base, uint64_t lease, struct store_sync_stats *st, char *err,
			 size_t errlen)
{
	int sdfd = -1, r = 0;
	struct sbx_spec *spec = calloc(1, sizeof(*spec));
	if (!spec)
		r = -ENOMEM;
	if (!r)
		r = sbx_spec_read(dfd, spec, err, errlen);
	const char *policy = "";
	if (!r)
		r = store_policy_id_of(cfg, spec->policy, &policy, err, errlen);
	char chain_dir[PATH_MAX + 64];
	snprintf(chain_dir, sizeof(chain_dir), "%s/%s/" SBX_CHAIN, root->state, name);
	if (!r && (sdfd = root_subdir(root, STORE_STAGE_DIR, err, errlen)) < 0)
		r = sdfd;
	if (!r) {
		char sname[SBX_NAME_MAX + 2];
		store_name_of(root, name, sname, sizeof(sname));
		char image_json[PATH_MAX + 64];
		snprintf(image_json, sizeof(image_json), "%s/%s/" SBX_IMAGE_JSON, root->state,
			 name);
		struct store_upload_src src = {.name = sname,
					       .chain_dir = chain_dir,
					       .spec = spec,
					       .image_json = image_json,
					       .policy_id = policy,
					       .key_type = store_key_type_of(spec->key),
					       .stage_dfd = sdfd,
					       .fenced = fenced,
					       .base = base,
					       .lease = lease};
		struct store_file *lz = NULL;
		src.nr_lazy = lazy_upload_files(dfd, &lz);
		src.lazy = lz;
		char stamps[PATH_MAX + 96];
		snprintf(stamps, sizeof(stamps), "%s/%s/" SBX_DIGEST_STAMPS, root->state, name);
		src.stamps = stamps;
		struct store_keyring kr = {cfg->fleet_key, cfg->fleet_key_len};
		/* Unfenced (no lease): the follower may be committing this host's last periodic
		 * snapshot just now, and a number lost to it is taken again as the next one. */
		for (int tries = 0; tries < 3; tries++) {
			r = store_upload_generation(c, &src, &kr, st, err, errlen);
			if (r != -EEXIST || fenced)
				break;
		}
		store_stats_note_upload(dfd, r, st);
		free(lz);
	}
	if (sdfd >= 0)
		close(sdfd);
	free(spec);
	return r;
}

/* The host's spec for a fetched manifest: nothing in it is a path or command from the store. */
static int spec_from(const struct store_config *cfg, const struct sbx_root *root,
		     const struct store_manifest *m, struct sbx_spec *sp, char *err, size_t errlen)
{
	memset(sp, 0, sizeof(*sp));
	sp->mem_bytes = m->mem_bytes;
	sp->vcpus = m->vcpus;
	snprintf(sp->cmdline, sizeof(sp->cmdline), "%s", m->cmdline);
	sp->nr_disks = m->nr_disks;
	sp->vsock_rate = m->vsock_rate;
	sp->snapshot_every_ms = m->snapshot_every_ms;
	sp->idle_stop_ms = m->idle_stop_ms;
	sp->created_ms = m->created_ms;
	for (size_t i = 0; i < m->nr_files; i++) {
		const struct store_file *f = &m->files[i];
		char hex[DIGEST_HEX_LEN], *dst = NULL;
		unsigned d;
		digest_hex(f->digest, hex);
		if (!strcmp(f->name, "kernel"))
			dst = sp->kernel;
		else if (!strcmp(f->name, "initrd"))
			dst = sp->initrd;
		else if (sscanf(f->name, "disk%u-base", &d) == 1 && store_image_name(f->name) &&
			 (int)d < m->nr_disks)
			dst = sp->disks[d].path;
		if (dst && (size_t)snprintf(dst, PATH_MAX, "%.*s/" STORE_IMAGES_DIR "/%s",
					    PATH_MAX - 100, root->state, hex) >= PATH_MAX)
			return errmsg(err, errlen, -ENAMETOOLONG, "state root path too long");
	}
	if (!sp->kernel[0])
		return errmsg(err, errlen, -EBADMSG, "the manifest names no kernel");
	for (int i = 0; i < m->nr_disks; i++) {
		if (!sp->disks[i].path[0])
			return errmsg(err, errlen, -EBADMSG,
				      "the manifest names no base for disk %d", i);
		sp->disks[i].read_only = m->disks[i].read_only;
		sp->disks[i].overlay = m->disks[i].overlay;
	}
	const char *key = !m->key_type[0]		   ? ""
			  : !strcmp(m->key_type, "pkcs11") ? cfg->pkcs11_spec
							   : cfg->key_cmd_spec;
	if (m->key_type[0] && !key[0])
		return errmsg(err, errlen, -ENOKEY,
			      "the sandbox is encrypted under a %s key provider, and store.json's "
			      "key_providers names none",
			      m->key_type);
	if (strlen(key) >= sizeof(sp->key))
		return errmsg(err, errlen, -ENAMETOOLONG, "key provider spec too long");
	memcpy(sp->key, key, strlen(key) + 1);
	for (int i = 0; m->policy_id[0] && i < cfg->nr_policies; i++)
		if (!strcmp(cfg->policies[i].id, m->policy_id))
			snprintf(sp->policy, sizeof(sp->policy), "%s", cfg->policies[i].path);
	if (m->policy_id[0] && !sp->policy[0])
		return errmsg(err, errlen, -ENOENT,
			      "the sandbox's policy id \"%s\" is not in store.json's policies",
			      m->policy_id);
	return 0;
}

static int pull_locked(struct s3_client *c, const struct store_config *cfg,
		       const struct sbx_root *root, const char *name, uint64_t gen,
		       struct store_sync_stats *st, char *err, size_t errlen);

int store_pull_sandbox(struct s3_client *c, const struct store_config *cfg,
		       const struct sbx_root *root, const char *name, uint64_t gen,
		       struct store_sync_stats *st, char *err, size_t errlen)
{
	if (!cfg->fleet_key_len)
		return errmsg(err, errlen, -ENOKEY, "store.json names no fleet_key_file");
	int r =
	    root->templates ? tpl_name_check(name, err, errlen) : sbx_name_check(name, err, errlen);
	if (r)
		return r;
	/* One pull of a name at a time on this host: the others wait, then find it here. */
	char lock[SBX_NAME_MAX + 32];
	snprintf(lock, sizeof(lock), ".pull-%s.lock", name);
	int lk = sbx_lock_take(root->dfd, lock, true, false);
	if (lk < 0)
		return errmsg(err, errlen, lk, "%s/%s: %s", root->state, lock, strerror(-lk));
	struct stat sb;
	if (fstatat(root->dfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
		close(lk);
		return errmsg(err, errlen, -EEXIST, "sandbox %s is already on this host", name);
	}
	r = pull_locked(c, cfg, root, name, gen, st, err, errlen);
	close(lk);
	return r;
}

/* Replaces `name` beneath dfd with a hard link of `from` beneath idfd. 0 or -errno. */
static int link_over(int idfd, const char *from, int dfd, const char *name)
{
	char tmp[64];
	snprintf(tmp, sizeof(tmp), ".%s.link", name);
	unlinkat(dfd, tmp, 0);
	if (linkat(idfd, from, dfd, tmp, 0) < 0)
		return -errno;
	if (renameat(dfd, tmp, dfd, name) < 0) {
		int e = -errno;
		unlinkat(dfd, tmp, 0);
		return e;
	}
	return 0;
}

/*
 * A sandbox made from an OCI image, fetched: as on the host that made it, its directory holds
 * hard links of the image's root and record (from this host's image cache, by digest), and disk
 * 0 names its own link, so that evicting the cache's copy or forking it never breaks it.
 */
static int image_files_adopt(const struct sbx_root *root, const char *name,
			     const struct store_manifest *m, int idfd, int dfd, struct sbx_spec *sp,
			     char *err, size_t errlen)
{
	for (size_t i = 0; i < m->nr_files; i++) {
		if (strcmp(m->files[i].name, STORE_IMAGE_JSON))
			continue;
		char hex[DIGEST_HEX_LEN];
		digest_hex(m->files[i].digest, hex);
		int r = link_over(idfd, hex, dfd, SBX_IMAGE_JSON);
		if (r)
			return errmsg(err, errlen, r, "%s: cannot link its image record: %s", name,
				      strerror(-r));
	}
	if (!sbx_spec_is_image(sp))
		return 0;
	const char *base = strrchr(sp->disks[0].path, '/');
	int r = base ? link_over(idfd, base + 1, dfd, SBX_IMAGE_EXT4) : -EINVAL;
	if (r)
		return errmsg(err, errlen, r, "%s: cannot link its image's root: %s", name,
			      strerror(-r));
	if (sbx_image_disk_point(sp, root->state, name))
		return errmsg(err, errlen, -ENAMETOOLONG, "%s: its path is too long", name);
	return 0;
}

static int pull_locked(struct s3_client *c, const struct store_config *cfg,
		       const struct sbx_root *root, const char *name, uint64_t gen,
		       struct store_sync_stats *st, char *err, size_t errlen)
{
	int r = 0;
	uint32_t tag = 0;
	if (getrandom(&tag, sizeof(tag), 0) != (ssize_t)sizeof(tag))
		return errmsg(err, errlen, -EIO, "no random bytes");
	char tmp[SBX_NAME_MAX + 32];
	snprintf(tmp, sizeof(tmp), ".pull-%s-%08x", name, tag);
	int idfd = root_subdir(root, STORE_IMAGES_DIR, err, errlen);
	if (idfd < 0)
		return idfd;
	int tdfd = -1, cdfd = -1;
	struct sbx_spec *sp = calloc(1, sizeof(*sp));
	struct store_manifest m = {0};
	bool fetched = false;
	/* Memory layers lazily, unless the host says otherwise (COVE_LAZY_PULL=0: whole). */
	const char *lz = getenv("COVE_LAZY_PULL");
	/* A template's layers are linked whole by its clones: always fetched whole. */
	struct sbx_lazy *lazy =
	    (lz && !strcmp(lz, "0")) || root->templates ? NULL : calloc(1, sizeof(*lazy));
	char sname[SBX_NAME_MAX + 2];
	store_name_of(root, name, sname, sizeof(sname));
	if (!sp)
		r = -ENOMEM;
	if (!r && (tdfd = root_subdir(root, tmp, err, errlen)) < 0)
		r = tdfd;
	if (!r && mkdirat(tdfd, SBX_CHAIN, 0700) < 0)
		r = errmsg(err, errlen, -errno, "%s: %s", tmp, strerror(errno));
	if (!r && (cdfd = openat(tdfd, SBX_CHAIN, O_RDONLY | O_DIRECTORY | O_NOFOLLOW)) < 0)
		r = errmsg(err, errlen, -errno, "%s/chain: %s", tmp, strerror(errno));
	if (!r) {
		struct store_keyring kr = {cfg->fleet_key, cfg->fleet_key_len};
		r = store_fetch_generation(c, sname, gen, &kr, cdfd, idfd, lazy, &m, st, err,
					   errlen);
		fetched = !r;
	}
	if (!r)
		r = spec_from(cfg, root, &m, sp, err, errlen);
	if (!r)
		r = image_files_adopt(root, name, &m, idfd, tdfd, sp, err, errlen);
	if (!r && sbx_spec_write(tdfd, sp))
		r = errmsg(err, errlen, -EIO, "%s: cannot write its spec", name);
	if (!r && store_base_save(tdfd, st->generation))
		r = errmsg(err, errlen, -EIO, "%s: cannot record its generation", name);
	if (!r && lazy && lazy->n) {
		lazy->generation = st->generation;
		r = sbx_lazy_save(tdfd, lazy);
		if (r)
			errmsg(err, errlen, r, "%s: cannot write " SBX_LAZY_FILE, name);
	}
	if (!r) {
		char why[96];
		snprintf(why, sizeof(why), "fetched generation %llu from the store",
			 (unsigned long long)st->generation);
		r = sbx_event_append(tdfd, "creating", "stopped", why);
		if (r)
			errmsg(err, errlen, r, "%s: cannot write its event log", name);
	}
	if (!r)
		store_stats_add(tdfd, &(struct store_stats){.fetched_bytes = st->bytes_sent});
	/* A template is saved once its record is written (lifecycle/template.h). */
	if (!r && root->templates) {
		struct tpl_meta tm = {.created_ms = m.created_ms};
		snprintf(tm.name, sizeof(tm.name), "%s", name);
		r = tpl_meta_write(tdfd, &tm);
		if (r)
			errmsg(err, errlen, r, "%s: cannot write " TPL_META, name);
	}
	if (!r && renameat2(root->dfd, tmp, root->dfd, name, RENAME_NOREPLACE) < 0)
		r = errmsg(err, errlen, -errno, "sandbox %s: %s", name,
			   errno == EEXIST ? "made on this host meanwhile" : strerror(errno));
	if (r && tdfd >= 0)
		sbx_tree_remove(root->dfd, tmp);
	if (fetched)
		store_manifest_free(&m);
	if (cdfd >= 0)
		close(cdfd);
	if (tdfd >= 0)
		close(tdfd);
	close(idfd);
	free(sp);
	free(lazy);
	return r;
}

int store_refresh_sandbox(struct s3_client *c, const struct store_config *cfg,
			  const struct sbx_root *root, const char *name, int dfd, uint64_t gen,
			  struct store_sync_stats *st, char *err, size_t errlen)
{
	uint32_t tag = 0;
	if (getrandom(&tag, sizeof(tag), 0) != (ssize_t)sizeof(tag))
		return errmsg(err, errlen, -EIO, "no random bytes");
	char fresh[32], stale[32];
	snprintf(fresh, sizeof(fresh), SBX_CHAIN ".pull-%08x", tag);
	snprintf(stale, sizeof(stale), SBX_CHAIN ".stale-%08x", tag);
	int idfd = root_subdir(root, STORE_IMAGES_DIR, err, errlen);
	if (idfd < 0)
		return idfd;
	int cdfd = -1, r = 0;
	struct sbx_spec *sp = calloc(1, sizeof(*sp));
	struct store_manifest m = {0};
	bool fetched = false;
	if (!sp)
		r = -ENOMEM;
	if (!r && mkdirat(dfd, fresh, 0700) < 0)
		r = errmsg(err, errlen, -errno, "%s/%s: %s", name, fresh, strerror(errno));
	if (!r && (cdfd = openat(dfd, fresh, O_RDONLY | O_DIRECTORY | O_NOFOLLOW)) < 0)
		r = errmsg(err, errlen, -errno, "%s/%s: %s", name, fresh, strerror(errno));
	if (!r) {
		struct store_keyring kr = {cfg->fleet_key, cfg->fleet_key_len};
		r = store_fetch_generation(c, name, gen, &kr, cdfd, idfd, NULL, &m, st, err,
					   errlen);
		fetched = !r;
		store_stats_add(dfd, r ? &(struct store_stats){.fetch_errors = 1}
				       : &(struct store_stats){.fetched_bytes = st->bytes_sent});
	}
	if (!r)
		r = spec_from(cfg, root, &m, sp, err, errlen);
	if (!r)
		r = image_files_adopt(root, name, &m, idfd, dfd, sp, err, errlen);
	/* The whole new chain in place of the old one, then its spec and base. */
	if (!r && renameat(dfd, SBX_CHAIN, dfd, stale) < 0 && errno != ENOENT)
		r = errmsg(err, errlen, -errno, "%s: setting its old chain aside: %s", name,
			   strerror(errno));
	if (!r && renameat(dfd, fresh, dfd, SBX_CHAIN) < 0) {
		r = errmsg(err, errlen, -errno, "%s: placing the fetched chain: %s", name,
			   strerror(errno));
		renameat(dfd, stale, dfd, SBX_CHAIN);
	}
	/* The files an earlier lazy pull left arriving went with the old chain. */
	if (!r)
		unlinkat(dfd, SBX_LAZY_FILE, 0);
	if (!r && sbx_spec_write(dfd, sp))
		r = errmsg(err, errlen, -EIO, "%s: cannot write its spec", name);
	if (!r)
		r = store_base_save(dfd, st->generation);
	if (!r) {
		char why[96];
		snprintf(why, sizeof(why), "fetched generation %llu from the store",
			 (unsigned long long)st->generation);
		sbx_event_append(dfd, "stopped", "stopped", why);
	}
	sbx_tree_remove(dfd, r ? fresh : stale);
	if (fetched)
		store_manifest_free(&m);
	if (cdfd >= 0)
		close(cdfd);
	close(idfd);
	free(sp);
	return r;
}
