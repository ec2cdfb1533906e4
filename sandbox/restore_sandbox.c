/* Restoring a sandbox: machine description, host paths, then build, restore and serve the VM. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "devices/overlay.h"
#include "devices/virtio_blk.h"
#include "sandbox/phase_hook.h"
#include "sandbox/restore_sandbox.h"
#include "sandbox/sandbox.h"
#include "snapshot/board_state.h"

/* restore_and_serve: failed, and the --ready-fd pipe has the reason already. */
#define RESTORE_TOLD 2

static struct snap_restore_args snap_args(const struct sandbox_restore_opts *o)
{
	return (struct snap_restore_args){.dir = o->dir,
					  .layer = o->layer,
					  .key = o->key,
					  .key_relay = o->jail.key_relay_fd,
					  .verify = o->verify,
					  .digests_checked = o->digests_checked,
					  .lazy_fd = o->lazy_fd,
					  .snap_dir = o->snap_dir};
}

int sandbox_restore_open(struct sandbox_restore *p, const struct sandbox_restore_opts *o, char *err,
			 size_t errlen)
{
	struct snap_restore_args a = snap_args(o);
	int r = snap_restore_open(&p->snap, &a, err, errlen);
	if (r)
		return r;
	const struct state_section_ref *cfg = p->snap.config;
	r = machine_config_parse((const char *)cfg->payload, cfg->len, &p->mc, err, errlen);
	if (r)
		return r;
	if (p->mc.mem_size != p->snap.chain.ram_size)
		return errmsg(err, errlen, -EINVAL, "%s/%s: RAM size differs from the chain's",
			      o->dir, p->snap.chain.layers[p->snap.idx].state);
	return 0;
}

/*
 * Host paths come from the host: each saved disk from --disk (by index, size and ro), frozen
 * overlay layers by their plain names inside DIR, the vsock socket from --vsock-uds. The state
 * file only says what the machine had.
 */
static int plan_host_paths(struct sandbox_restore *p, const struct sandbox_restore_opts *o,
			   char *err, size_t errlen)
{
	struct machine_config *mc = &p->mc;
	for (int i = 0; i < mc->nr_disks; i++) {
		bool ovl = mc->disks[i].overlay[0];
		if (i >= o->nr_disks)
			return errmsg(
			    err, errlen, -EINVAL,
			    "the snapshot has disk %d (/dev/vd%c, %llu bytes%s): give its "
			    "host file with --disk PATH%s",
			    i, 'a' + i, (unsigned long long)mc->disk_size[i],
			    mc->disks[i].read_only ? ", read-only"
			    : ovl		   ? ", the base under an overlay"
						   : "",
			    mc->disks[i].read_only ? ",ro" : "");
		const struct disk_opt *h = &o->disks[i];
		if (h->overlay[0])
			return errmsg(
			    err, errlen, -EINVAL,
			    "--disk %s: restore does not take overlay= (a disk's frozen "
			    "layers are in %s, its new top goes into the snapshot directory)",
			    h->path, o->dir);
		if (h->read_only != mc->disks[i].read_only)
			return errmsg(err, errlen, -EINVAL,
				      "--disk %s: disk %d was saved %s, give it %s", h->path, i,
				      mc->disks[i].read_only ? "read-only" : "writable",
				      mc->disks[i].read_only ? "with ,ro" : "without ,ro");
		uint64_t size;
		int r = machine_disk_size(h->path, &size);
		if (r)
			return errmsg(err, errlen, r, "--disk %s: %s", h->path, strerror(-r));
		if (size != mc->disk_size[i])
			return errmsg(err, errlen, -EINVAL,
				      "--disk %s: %llu bytes, but disk %d of the snapshot has %llu",
				      h->path, (unsigned long long)size, i,
				      (unsigned long long)mc->disk_size[i]);
		snprintf(mc->disks[i].path, sizeof(mc->disks[i].path), "%s", h->path);
		mc->disks[i].rate = h->rate; /* limits are this command line's, never the chain's */
		for (int k = 0; k < mc->chains[i].n; k++) {
			char *lp = mc->chains[i].paths[k];
			char name[256]; /* a plain name (machine_config_parse): at most 255 bytes */
			size_t nl = strlen(lp);
			if (nl >= sizeof(name))
				return errmsg(err, errlen, -EINVAL, "disk %d: layer name too long",
					      i);
			memcpy(name, lp, nl + 1);
			if (snprintf(lp, sizeof(mc->chains[i].paths[k]), "%s/%s", o->dir, name) >=
			    (int)sizeof(mc->chains[i].paths[k]))
				return errmsg(err, errlen, -ENAMETOOLONG, "%s: path too long",
					      o->dir);
		}
	}
	if (o->nr_disks > mc->nr_disks)
		return errmsg(err, errlen, -EINVAL, "--disk %s: the snapshot has only %d disk(s)",
			      o->disks[mc->nr_disks].path, mc->nr_disks);
	if (mc->vsock_cid && !o->vsock_uds)
		return errmsg(
		    err, errlen, -EINVAL,
		    "the snapshot has a vsock device (CID %llu): give its host socket with "
		    "--vsock-uds PATH",
		    (unsigned long long)mc->vsock_cid);
	if (!mc->vsock_cid && o->vsock_uds)
		return errmsg(err, errlen, -EINVAL,
			      "--vsock-uds: the snapshot has no vsock device");
	if (!mc->vsock_cid && o->vsock_rate)
		return errmsg(err, errlen, -EINVAL,
			      "--vsock-rate: the snapshot has no vsock device");
	return 0;
}

int sandbox_restore_validate(struct sandbox_restore *p, const struct sandbox_restore_opts *o,
			     char *err, size_t errlen)
{
	int r = plan_host_paths(p, o, err, errlen);
	if (r)
		return r;
	struct snap_restore_args a = snap_args(o);
	return snap_restore_validate(&p->snap, &a, err, errlen);
}

void sandbox_restore_close(struct sandbox_restore *p)
{
	snap_restore_close(&p->snap);
}

/*
 * Frozen disk layers of an encrypted chain are sealed: authenticate every map (and with
 * --verify every chunk) before the guest runs; a layer in clear there, or a sealed one in a
 * plain chain, is refused. One line in err.
 */
static int check_disk_layers(struct sandbox *sb, struct snap_restore *s,
			     const struct sandbox_restore_opts *o, char *err, size_t errlen)
{
	for (int i = 0; i < board_count(&sb->board, &virtio_blk_type); i++) {
		struct virtio_blk *disk = board_nth(&sb->board, &virtio_blk_type, i);
		struct overlay *ov = disk ? disk->ov : NULL;
		int sealed, plain;
		if (!ov)
			continue;
		overlay_count_sealed(ov, &sealed, &plain);
		if (s->encrypted && plain)
			return errmsg(
			    err, errlen, -EBADMSG,
			    "disk %d: %d frozen overlay layer(s) in clear in an encrypted "
			    "chain (altered, or not this chain's)",
			    i, plain);
		if (!s->encrypted && sealed)
			return errmsg(
			    err, errlen, -EINVAL,
			    "disk %d: sealed overlay layers in a chain that is not encrypted", i);
		if (!sealed)
			continue;
		const struct overlay_sealer *sl = sandbox_sealer(sb, &s->crypt);
		if (!sl)
			return errmsg(err, errlen, -ENOMEM, "cannot set up sealing of disk layers");
		int r = overlay_attach_sealer(ov, sl, err, errlen);
		if (!r && o->verify)
			r = overlay_verify_sealed(ov, err, errlen);
		if (r)
			return r;
	}
	return 0;
}

static int restore_and_serve(struct sandbox *sb, struct sandbox_restore *p,
			     const struct sandbox_restore_opts *o, struct lazy_mem *lm)
{
	struct snap_restore *s = &p->snap;
	char err[512];
	/* Test hooks: "opened" here, "built", then "state" and "started" in sandbox_serve. */
	sb->phase_dir = o->phase_dir;
	sb->no_seccomp = o->no_seccomp;
	if (phase_hook(sb->phase_dir, "opened", &sb->log))
		return 1;
	uint64_t t0 = mono_us();
	if (o->vsock_uds) {
		snprintf(p->mc.vsock_uds, sizeof(p->mc.vsock_uds), "%s", o->vsock_uds);
		if (o->vsock_cid)
			p->mc.vsock_cid = o->vsock_cid;
	}
	p->mc.vsock_rate = o->vsock_rate;
	bool latest = snap_restore_is_latest(s);
	const char *sdir = o->snap_dir ? o->snap_dir : latest ? o->dir : NULL;
	if (o->snap_dir && !latest && !strcmp(o->snap_dir, o->dir)) {
		log_err(&sb->log, "--snapshot-dir: an older layer cannot continue its own chain; "
				  "give another directory");
		return 1;
	}
	/*
	 * Disks with an overlay: the snapshot's disk is the base plus its frozen layers; this
	 * process writes into a top of its own (the snapshotted process, or other clones, may
	 * still be writing theirs).
	 */
	const char *topdir = sdir ? sdir : o->dir;
	int tdfd = dirfd_open_dir(topdir, sdir != NULL, err, sizeof(err));
	if (tdfd < 0) {
		log_err(&sb->log, "%s", err);
		return 1;
	}
	close(tdfd);
	/*
	 * The layer id in a top's name: the restored layer's in its own chain; 0 in a new chain
	 * (--snapshot-dir elsewhere), whose layer id counter starts at 1 and must stay above
	 * every id its files carry (snapshot/keyfile.c).
	 */
	uint64_t top_id = sdir && strcmp(sdir, o->dir) ? 0 : s->chain.layers[s->idx].id;
	for (int i = 0; i < p->mc.nr_disks; i++) {
		if (!p->mc.disks[i].overlay[0])
			continue;
		/*
		 * A name no earlier run used: a jailed VMM is always pid 1, and an old top of
		 * the same name would be taken up with that run's writes in it.
		 */
		uint32_t tag = 0;
		if (getrandom(&tag, sizeof(tag), 0) != (ssize_t)sizeof(tag)) {
			log_err(&sb->log, "disk %d: no random name for its top", i);
			return 1;
		}
		if (snprintf(p->mc.disks[i].overlay, sizeof(p->mc.disks[i].overlay),
			     "%s/disk%d-r%06llu-%08x.ovl", topdir, i, (unsigned long long)top_id,
			     tag) >= (int)sizeof(p->mc.disks[i].overlay)) {
			log_err(&sb->log, "disk overlay path too long");
			return 1;
		}
	}
	uint64_t copied = 0, ram_off;
	int nr_layers = s->ls->nr, ram_fd;
	/* Logging from the start: the restored sandbox can go on with incremental snapshots. */
	snap_restore_ram_backing(s, &ram_fd, &ram_off);
	/* Before the build: with an API socket it forks the clone spawner, which needs both. */
	sb->api_sock = o->api_sock;
	sb->exe_fd = o->jail.exe_fd;
	sb->key_relay_fd = o->jail.key_relay_fd;
	if (sdir && s->encrypted)
		sb->snap_key = o->key;
	uint64_t t_build = mono_us();
	if (sandbox_build(sb, &p->mc, true, ram_fd, ram_off))
		return 1;
	t_build = mono_us() - t_build;
	if (phase_hook(sb->phase_dir, "built", &sb->log))
		return 1;
	uint64_t t_ram = mono_us();
	if (snap_restore_apply_ram(s, &sb->vm, lm, &copied, err, sizeof(err))) {
		log_err(&sb->log, "%s", err);
		return 1;
	}
	t_ram = mono_us() - t_ram;
	uint64_t t_state = mono_us();
	int rs = check_disk_layers(sb, s, o, err, sizeof(err));
	if (!rs)
		rs = snap_restore_apply_state(s, &sb->vm, &sb->board, err, sizeof(err));
	if (rs) {
		log_err(&sb->log, "%s", err);
		/* This host's CPU cannot take the chain's state: the host says so by its own exit
		 * status (76), so a scheduler places the sandbox elsewhere. */
		if (rs == -ENOEXEC && o->ready_fd >= 0) {
			dprintf(o->ready_fd, RESTORE_CPU_REFUSED "%s\n", err);
			return RESTORE_TOLD;
		}
		return 1;
	}
	board_resume_restored(&sb->board, &sb->log);
	t_state = mono_us() - t_state;
	/* Chains this sandbox writes keep this chain's data key: they share its disk layers. */
	if (s->encrypted && sandbox_keep_data_key(sb, s->crypt.key)) {
		log_err(&sb->log, "out of memory");
		return 1;
	}
	if (sdir) {
		/* Encrypted: the host's --key (snap_restore_open required it, set before the
		 * build), for this or a new chain. */
		if (sandbox_snapshots(sb, sdir, o->interval_ms, o->keep))
			return 1;
		sb->snap.ram_lazy = s->encrypted || o->lazy_fd > 2;
		sb->snap.layers_arriving = o->lazy_fd > 2;
		/* Same chain, latest layer: the next snapshot may be incremental. */
		if (!strcmp(sdir, o->dir) && latest)
			snap_ctx_adopt_chain(&sb->snap, &s->chain);
	} else if (o->interval_ms) {
		log_err(&sb->log,
			"--snapshot-interval needs --snapshot-dir when restoring an older layer");
		return 1;
	}
	/* Where a restore's time goes: opening and checking the chain (before this function),
	 * building the VM and devices, its RAM, vCPU and device state. */
	log_info(&sb->log,
		 "restored layer %llu of %s: %d layer(s)%s, %llu increment pages copied, %llu us "
		 "(chain checked in %llu us before; VM built %llu, RAM %llu, state %llu)",
		 (unsigned long long)s->chain.layers[s->idx].id, o->dir, nr_layers,
		 s->encrypted ? ", encrypted (pages decrypted on first touch)" : "",
		 (unsigned long long)copied, (unsigned long long)(mono_us() - t0),
		 (unsigned long long)o->checked_us, (unsigned long long)t_build,
		 (unsigned long long)t_ram, (unsigned long long)t_state);
	if (s->ls)
		layer_set_close(s->ls);
	sb->ready_fd = o->ready_fd;
	sb->idle.limit_ms = o->idle_stop_ms;
	sb->snap_root = o->snap_root;
	return sandbox_serve(sb, o->api_sock);
}

int sandbox_restore_run(struct sandbox_restore *p, const struct sandbox_restore_opts *o)
{
	struct sandbox *sb = calloc(1, sizeof(*sb));
	if (!sb) {
		fprintf(stderr, "cove restore: out of memory\n");
		return 1;
	}
	int status = 1;
	struct lazy_mem lm = {.uffd = -1, .stop_efd = -1};
	if (sandbox_init(sb, o->console, o->console_max, o->level) == 0)
		status = restore_and_serve(sb, p, o, &lm);
	/* The lazy thread may be blocked serving RAM the vCPUs touch: stop it after them. */
	lazy_mem_stop(&lm);
	if (status == RESTORE_TOLD)
		status = 1;
	else if (status && sb->ready_fd < 0 && o->ready_fd >= 0 &&
		 vm_get_state(&sb->vm) == VM_NOT_STARTED)
		dprintf(o->ready_fd, "restore failed (see its log)\n");
	sandbox_destroy(sb);
	free(sb);
	return status;
}
