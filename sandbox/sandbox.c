/* One sandbox process: the VM, its board, console, signals, control API and snapshots, served from
 * one event loop. */
#include "sandbox/sandbox.h"

#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <time.h>
#include <sys/random.h>
#include <unistd.h>

#include "sandbox/agent_client.h"
#include "sandbox/disk_merge.h"
#include "sandbox/phase_hook.h"
#include "sandbox/seccomp_filters.h"
#include "common/clock.h"
#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "snapshot/keyprov.h"
#include "snapshot/snap_crypt.h"
#include "devices/overlay.h"
#include "devices/virtio_balloon.h"
#include "devices/virtio_blk.h"
#include "devices/virtio_vsock.h"
#include "sandbox/vm_api.h"

/* The API backend's opaque pointer is the VM (vm_api.c); snapshot hooks need its sandbox. */
static struct sandbox *sandbox_of(void *vm)
{
	return (struct sandbox *)((char *)vm - offsetof(struct sandbox, vm));
}

static void on_stop(void *opaque, uint32_t events)
{
	struct sandbox *c = opaque;
	(void)events;
	uint64_t v;
	if (read(c->vm.stop_efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		log_warn(&c->log, "reading stop eventfd: %s", strerror(errno));
	evloop_stop(&c->vm.loop);
}

static void on_signal(void *opaque, uint32_t events)
{
	struct sandbox *c = opaque;
	(void)events;
	struct signalfd_siginfo si;
	if (read(c->sig_fd, &si, sizeof(si)) != sizeof(si))
		return;
	vm_request_stop(&c->vm, 0, "stopped by %s", strsignal((int)si.ssi_signo));
}

static void on_stdin(void *opaque, uint32_t events)
{
	struct sandbox *c = opaque;
	uint8_t buf[256];
	ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));
	if (n > 0) {
		size_t took = serial_push_input(&c->board.com1, buf, (size_t)n);
		if (took < (size_t)n)
			log_warn(&c->log, "console input: guest is not reading, dropped %zu bytes",
				 (size_t)n - took);
		return;
	}
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	(void)events;
	/* End of input (or an error): stop watching, the guest keeps running. */
	evloop_del(&c->vm.loop, STDIN_FILENO);
}

int sandbox_init(struct sandbox *sb, const char *console_path, uint64_t console_max,
		 enum log_level level)
{
	memset(sb, 0, sizeof(*sb));
	sb->sig_fd = sb->timer_fd = sb->ready_fd = sb->idle.timer_fd = sb->exe_fd = -1;
	sb->key_relay_fd = -1;
	for (int i = 0; i < RUN_MAX_DISKS; i++)
		sb->disk_merges[i].layer.data_fd = -1;
	sb->spawner = (struct spawner){.sock = -1, .pid = -1};
	sb->log = (struct logger){.level = level, .out = stderr};
	sb->log_level = level;
	sb->console_path = console_path;
	sb->console_max = console_max ? console_max : RUN_DEFAULT_CONSOLE_MAX;
	/*
	 * Guest output is the guest's: the file is private (0600), never opened through a link
	 * someone planted at its name, and not inherited by the clones this process spawns.
	 */
	if (!console_path)
		sb->console_fd = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
	else
		sb->console_fd =
		    open(console_path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (sb->console_fd < 0) {
		int e = errno;
		log_err(&sb->log, "cannot open console %s: %s",
			console_path ? console_path : "stdout", strerror(e));
		return -e;
	}
	/* SIGINT/SIGTERM/SIGHUP arrive through a signalfd; vCPU threads inherit the blocked mask.
	 */
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGHUP);
	if (pthread_sigmask(SIG_BLOCK, &set, NULL))
		return -EINVAL;
	signal(SIGPIPE, SIG_IGN);
	sb->sig_fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sb->sig_fd < 0) {
		log_err(&sb->log, "cannot set up signal handling");
		return -errno;
	}
	return 0;
}

/* Each VM thread installs its own filter on itself, before its first guest work. */
static int thread_hook(void *opaque, enum vm_thread_kind kind)
{
	struct sandbox *sb = opaque;
	enum seccomp_kind k = kind == VM_THREAD_VCPU ? SECCOMP_VCPU : SECCOMP_UFFD;
	char err[256];
	int r = seccomp_install(k, err, sizeof(err));
	if (r) {
		log_err(&sb->log, "%s", err);
		return r;
	}
	seccomp_test_trigger(k);
	return 0;
}

/*
 * Decides whether this process runs under seccomp and, if so, sets the SIGSYS reporter up and
 * hooks the VM's threads. Before any thread of the VM starts.
 */
static int seccomp_begin(struct sandbox *sb)
{
	if (sb->no_seccomp) {
		log_warn(&sb->log,
			 "*** --no-seccomp: this VMM runs WITHOUT seccomp filters: a guest "
			 "that breaks into it can make any system call (debugging only) ***");
		return 0;
	}
	if (seccomp_sanitized_build()) {
		log_info(&sb->log, "seccomp: filters off in this sanitizer build (LeakSanitizer "
				   "needs ptrace and clone at exit)");
		return 0;
	}
	int r = seccomp_trap_init();
	if (r) {
		log_err(&sb->log, "seccomp: cannot install the SIGSYS handler: %s", strerror(-r));
		return r;
	}
	sb->seccomp_on = true;
	/*
	 * The filters forbid io_uring_setup (a ring escapes seccomp): the snapshot writer gets its
	 * one restricted ring now, or writes with pwrite.
	 */
	r = layer_ring_new(&sb->wring);
	if (r) {
		log_info(&sb->log, "seccomp: no io_uring for the snapshot writer (%s): pwrite",
			 strerror(-r));
		sb->wring = NULL;
	}
	sb->vm.thread_hook = thread_hook;
	sb->vm.thread_hook_opaque = sb;
	return 0;
}

/* Disk i as a clone is given it (the spawner gives a clone no other). */
static void clone_disk_arg(const struct sandbox *sb, int i, char *out, size_t cap)
{
	char rate[120]; /* the parent's limits: a clone is host configured as its parent */
	if (disk_rate_format(&sb->mc.disks[i].rate, rate, sizeof(rate)))
		rate[0] = '\0'; /* cannot happen: four numbers fit */
	snprintf(out, cap, "%s%s%s", sb->mc.disks[i].path, sb->mc.disks[i].read_only ? ",ro" : "",
		 rate);
}

int sandbox_build(struct sandbox *sb, const struct machine_config *mc, bool track_dirty, int mem_fd,
		  uint64_t mem_off)
{
	sb->mc = *mc;
	struct vm_config cfg = {
	    .mem_size = mc->mem_size,
	    .nr_vcpus = mc->vcpus,
	    .track_dirty = track_dirty,
	    .mem_from_file = mem_fd >= 0,
	    .mem_file_fd = mem_fd,
	    .mem_file_off = mem_off,
	};
	snprintf(cfg.cpu_template, sizeof(cfg.cpu_template), "%s", mc->cpu_template);
	/*
	 * PUT /fork starts clones through the spawner, forked now: before the VM's fds, guest RAM
	 * and threads exist, and before any filter (the filtered VMM never forks or execs).
	 */
	if (sb->api_sock && sb->spawner.sock < 0) {
		struct spawner_disks *disks = calloc(1, sizeof(*disks));
		if (!disks)
			return -ENOMEM;
		for (int i = 0; i < sb->mc.nr_disks && i < SPAWNER_DISKS_MAX; i++)
			clone_disk_arg(sb, i, disks->arg[i], sizeof(disks->arg[i]));
		disks->nr = sb->mc.nr_disks;
		int e = spawner_start_disks(&sb->spawner, sb->snap_key, disks, sb->exe_fd);
		free(disks);
		if (e) {
			log_err(&sb->log, "cannot start the clone spawner: %s", strerror(-e));
			return e;
		}
	}
	sb->vm_created = true; /* vm_create cleans up after itself but leaves a destroyable vm */
	int r = vm_create(&sb->vm, &cfg, &sb->log);
	if (r)
		return r;
	r = seccomp_begin(sb);
	if (r)
		return r;
	r = board_create(&sb->board, &sb->vm.host, sb->console_fd);
	if (r)
		return r;
	sb->board.com1.out_max = sb->console_max;
	sb->board_created = true;
	/* Slots in this order (disks, vsock, then the rest), as snapshots record them. */
	for (int i = 0; i < mc->nr_disks; i++) {
		struct virtio_blk_cfg bc = {.disk = &mc->disks[i], .chain = &mc->chains[i]};
		r = board_add(&sb->board, &sb->vm.host, &virtio_blk_type, &bc);
		if (r)
			return r;
	}
	/* Restore matches the host's --disk to the saved one by index and this size. */
	for (int i = 0; i < mc->nr_disks; i++) {
		r = machine_disk_size(mc->disks[i].path, &sb->mc.disk_size[i]);
		if (r) {
			log_err(&sb->log, "disk %d (%s): %s", i, mc->disks[i].path, strerror(-r));
			return r;
		}
	}
	if (mc->vsock_cid) {
		struct virtio_vsock_cfg vc = {
		    .cid = mc->vsock_cid, .uds_path = mc->vsock_uds, .rate = mc->vsock_rate};
		r = board_add(&sb->board, &sb->vm.host, &virtio_vsock_type, &vc);
		if (r)
			return r;
	}
	for (int i = 0; i < mc->nr_devs; i++) {
		r = board_add(&sb->board, &sb->vm.host, mc->devs[i].type, mc->devs[i].cfg);
		if (r) {
			log_err(&sb->log, "%s: %s", mc->devs[i].type->name, strerror(-r));
			return r;
		}
	}
	/* What a snapshot records so restore can build the same machine. */
	sb->config_json = machine_config_to_json(&sb->mc);
	return sb->config_json ? 0 : -ENOMEM;
}

int sandbox_keep_data_key(struct sandbox *sb, const struct snap_key *key)
{
	if (sb->data_key)
		return 0;
	int r = crypto_key_import(crypto_key_bytes(key), &sb->data_key);
	if (!r && sb->snap_ready)
		sb->snap.inherit_key = sb->data_key;
	return r;
}

const struct overlay_sealer *sandbox_sealer(struct sandbox *sb, const struct snap_crypt *sc)
{
	for (int i = 0; i < sb->nr_sealers; i++)
		if (!memcmp(sb->sealers[i]->chain_id, sc->chain_id, sizeof(sc->chain_id)))
			return &sb->sealers[i]->ops;
	if (sb->nr_sealers == SANDBOX_MAX_SEALERS ||
	    snap_sealer_new(sc, &sb->sealers[sb->nr_sealers]))
		return NULL;
	return &sb->sealers[sb->nr_sealers++]->ops;
}

/*
 * A frozen overlay layer must live inside the chain directory, where restore finds it by name:
 * one elsewhere (the overlay the host named at `cove run`, or a layer of the chain this
 * sandbox was restored from) gets a hard link (data and map) in the directory. Frozen layers
 * never change, so a link is as good as a copy.
 */
static int adopt_layer(struct sandbox *sb, int disk, int k, uint64_t layer_id, char *path,
		       size_t cap, char *err, size_t errlen)
{
	const char *slash = strrchr(path, '/');
	const char *base = slash ? slash + 1 : path;
	struct stat in_dir, src;
	if (dirfd_plain_name(base) && stat(path, &src) == 0 &&
	    fstatat(sb->snap.dfd, base, &in_dir, AT_SYMLINK_NOFOLLOW) == 0 &&
	    in_dir.st_dev == src.st_dev && in_dir.st_ino == src.st_ino)
		return 0;
	char name[64], map_src[4200], map_name[80];
	snprintf(name, sizeof(name), "disk%d-%06llu-l%d.ovl", disk, (unsigned long long)layer_id,
		 k);
	snprintf(map_name, sizeof(map_name), "%s%s", name, OVERLAY_MAP_SUFFIX);
	if (snprintf(map_src, sizeof(map_src), "%s%s", path, OVERLAY_MAP_SUFFIX) >=
		(int)sizeof(map_src) ||
	    strlen(sb->snap.dir) + 1 + strlen(name) >= cap)
		return errmsg(err, errlen, -ENAMETOOLONG, "disk %d: overlay path too long", disk);
	const char *srcs[2] = {path, map_src}, *dsts[2] = {name, map_name};
	for (int j = 0; j < 2; j++) {
		(void)dirfd_unlink(sb->snap.dfd,
				   dsts[j]); /* a name of ours a failed snapshot left */
		if (linkat(AT_FDCWD, srcs[j], sb->snap.dfd, dsts[j], 0) < 0)
			return errmsg(
			    err, errlen, -errno,
			    "disk %d: cannot link its frozen overlay layer %s into %s (it "
			    "must be on the same filesystem): %s",
			    disk, srcs[j], sb->snap.dir, strerror(errno));
	}
	snprintf(path, cap, "%s/%s", sb->snap.dir, name);
	return 0;
}

/*
 * In the snapshot's pause: each overlay disk whose top holds data freezes it and goes on in a
 * new top in the snapshot directory, so the saved disk (base + frozen layers) is exactly the
 * disk the saved memory knows. In an encrypted chain the frozen layer is sealed as it freezes
 * (snapshot/CRYPTO.md): only the live top is ever in clear.
 */
static int prepare_snapshot(void *opaque, uint64_t layer_id, char **config_json, char *err,
			    size_t errlen)
{
	struct sandbox *sb = opaque;
	struct machine_config *mc = &sb->mc;
	const struct overlay_sealer *sealer = NULL;
	if (sb->snap.encrypted) {
		sealer = sandbox_sealer(sb, &sb->snap.crypt);
		if (!sealer || sandbox_keep_data_key(sb, sb->snap.crypt.key))
			return errmsg(err, errlen, -ENOMEM, "cannot set up sealing of disk layers");
	}
	int nr_disks = board_count(&sb->board, &virtio_blk_type);
	for (int i = 0; i < nr_disks; i++) {
		struct virtio_blk *disk = board_nth(&sb->board, &virtio_blk_type, i);
		struct overlay *sov = disk->ov;
		if (sov) {
			sov->sealer = sealer;
			sov->seal_layer_id = layer_id;
		}
		if (!mc->disks[i].overlay[0])
			continue;
		struct disk_chain *ch = &mc->chains[i];
		int mr = sandbox_merge_install(sb, i, err, errlen);
		if (mr)
			return mr;
		char top[4096];
		/*
		 * A new name each time (random: a crashed run's top may hold this layer id, and a
		 * jailed VMM is always pid 1), made with O_EXCL: the VMM never reopens or
		 * replaces a file (SECCOMP.md).
		 */
		uint32_t tag = 0;
		if (getrandom(&tag, sizeof(tag), 0) != (ssize_t)sizeof(tag))
			return errmsg(err, errlen, -EIO, "disk %d: no random name for its new top",
				      i);
		if (snprintf(top, sizeof(top), "%s/disk%d-%06llu-%08x.ovl", sb->snap.dir, i,
			     (unsigned long long)layer_id, tag) >= (int)sizeof(top))
			return errmsg(err, errlen, -ENAMETOOLONG, "disk overlay path too long");
		if (ch->n >= BOARD_DISK_LAYERS) {
			int r =
			    errmsg(err, errlen, -E2BIG,
				   "disk %d: its overlay chain holds %d frozen layers, the most a "
				   "snapshot can add to",
				   i, ch->n);
			/* Only if the top is empty can this snapshot go on without a new layer. */
			bool has_data = false;
			struct overlay *ov = disk->ov;
			for (size_t k = 0; ov && k < ov->bitmap_bytes && !has_data; k++)
				has_data = ov->bitmap[k] != 0;
			if (has_data)
				return r;
			continue;
		}
		int frozen;
		int r = virtio_blk_freeze(disk, top, &frozen, err, errlen);
		if (r)
			return r;
		if (frozen) {
			/* Where the frozen layer now is: the old top, or its sealed copy. */
			struct overlay *fov = disk->ov;
			if (overlay_layer_path(fov, fov->nr_layers - 1, ch->paths[ch->n],
					       sizeof(ch->paths[0])))
				return errmsg(err, errlen, -ENAMETOOLONG,
					      "disk %d: frozen layer path too long", i);
			ch->n++;
			snprintf(mc->disks[i].overlay, sizeof(mc->disks[i].overlay), "%s", top);
			log_info(&sb->log, "snapshot: disk %d: froze its overlay, now writing %s",
				 i, top);
		}
	}
	for (int i = 0; i < nr_disks; i++)
		for (int k = 0; k < mc->chains[i].n; k++) {
			int r = adopt_layer(sb, i, k, layer_id, mc->chains[i].paths[k],
					    sizeof(mc->chains[i].paths[k]), err, errlen);
			if (r)
				return r;
		}
	*config_json = machine_config_to_json(mc);
	return *config_json ? 0 : -ENOMEM;
}

int sandbox_snapshots(struct sandbox *sb, const char *dir, uint64_t interval_ms, int keep)
{
	char err[256];
	if (sb->snap_ready)
		snap_ctx_free(&sb->snap);
	sb->snap_ready = false;
	int r =
	    snap_ctx_init(&sb->snap, &sb->vm, &sb->board, sb->config_json, dir, err, sizeof(err));
	if (r) {
		log_err(&sb->log, "%s", err);
		return r;
	}
	if (sb->snap_key) {
		/* The provider comes from the host (command line), never from the chain's keys
		 * file. */
		struct keyprov *prov = NULL;
		r = keyprov_new_spec(sb->snap_key, &prov, err, sizeof(err));
		if (!r && sb->key_relay_fd >= 0)
			keyprov_set_relay(prov, sb->key_relay_fd);
		if (!r)
			r = snap_ctx_encrypt(&sb->snap, prov, err, sizeof(err));
		if (r) {
			if (prov && !sb->snap.prov)
				keyprov_free(prov);
			log_err(&sb->log, "%s", err);
			snap_ctx_free(&sb->snap);
			return r;
		}
	}
	if (keep)
		sb->snap.keep = keep;
	sb->snap.ring = sb->wring;
	if (sb->seccomp_on && !sb->wring)
		sb->snap.method = WRITE_PWRITE;
	sb->snap.inherit_key = sb->data_key;
	sb->snap.prepare = prepare_snapshot;
	sb->snap.prepare_opaque = sb;
	sb->snap_keep = keep;
	sb->snap_interval_ms = interval_ms;
	sb->snap_ready = true;
	return 0;
}

static void log_snapshot(struct sandbox *sb, const struct snap_stats *st)
{
	log_info(&sb->log,
		 "snapshot: layer %llu (%s): %llu pages, %llu stored (%llu KiB), paused %llu us, "
		 "written in %llu us%s",
		 (unsigned long long)st->layer_id, st->full ? "full" : "diff",
		 (unsigned long long)st->pages, (unsigned long long)st->stored,
		 (unsigned long long)(st->bytes >> 10), (unsigned long long)st->pause_us,
		 (unsigned long long)st->write_us, st->compacted ? ", chain compacted" : "");
}

/*
 * An API client names only directories the command line allowed: the sandbox's own
 * (--snapshot-dir) or ROOT/NAME under --snapshot-root. Anything else could point a Full
 * snapshot at a directory whose chain.json lists files it would then remove.
 */
static int api_dir_allowed(struct sandbox *sb, const char *dir, char *err, size_t errlen)
{
	size_t n = sb->snap_root ? strlen(sb->snap_root) : 0;
	while (n > 1 && sb->snap_root[n - 1] == '/')
		n--;
	if (n && !strncmp(dir, sb->snap_root, n) && dir[n] == '/' && dirfd_plain_name(dir + n + 1))
		return 0;
	const char *own = sb->snap_ready ? sb->snap.dir : NULL;
	if (own && sb->snap_root)
		return errmsg(err, errlen, -EINVAL,
			      "snapshot_dir '%.200s' is not allowed: give %s or NAME under %s", dir,
			      own, sb->snap_root);
	if (own)
		return errmsg(
		    err, errlen, -EINVAL,
		    "snapshot_dir '%.200s' is not allowed: this sandbox snapshots only into "
		    "its --snapshot-dir %s (or start it with --snapshot-root)",
		    dir, own);
	if (sb->snap_root)
		return errmsg(err, errlen, -EINVAL,
			      "snapshot_dir '%.200s' is not allowed: give NAME under %s", dir,
			      sb->snap_root);
	return errmsg(err, errlen, -EINVAL,
		      "snapshot_dir '%.200s' is not allowed: start cove with --snapshot-dir or "
		      "--snapshot-root to snapshot through the API",
		      dir);
}

/* The board's balloon (the first one), or NULL. */
static struct virtio_balloon *sandbox_balloon(struct sandbox *sb)
{
	return board_nth(&sb->board, &virtio_balloon_type, 0);
}

static int be_balloon_get(void *opaque, struct balloon_info *out)
{
	struct virtio_balloon *b = sandbox_balloon(sandbox_of(opaque));
	if (!b)
		return -ENODEV;
	virtio_balloon_info(b, out);
	return 0;
}

static int be_balloon_set(void *opaque, uint64_t target_mib)
{
	struct virtio_balloon *b = sandbox_balloon(sandbox_of(opaque));
	if (!b)
		return -ENODEV;
	virtio_balloon_set_target(b, target_mib * 256);
	return 0;
}

static int be_snapshot(void *opaque, bool full, const char *dir, struct api_snapshot_result *out,
		       char *err, size_t errlen)
{
	struct sandbox *sb = sandbox_of(opaque);
	if (dir && (!sb->snap_ready || strcmp(dir, sb->snap.dir))) {
		if (api_dir_allowed(sb, dir, err, errlen))
			return -EINVAL;
		if (sb->seccomp_on && sb->snap_key)
			return errmsg(
			    err, errlen, -EPERM,
			    "snapshot_dir '%.200s': a new encrypted chain needs the key "
			    "provider, which never runs after start under seccomp: snapshot "
			    "into this sandbox's --snapshot-dir",
			    dir);
		int r = sandbox_snapshots(sb, dir, sb->snap_interval_ms, sb->snap_keep);
		if (r)
			return errmsg(err, errlen, r, "cannot use snapshot directory %s", dir);
	}
	if (!sb->snap_ready)
		return errmsg(
		    err, errlen, -EINVAL,
		    "no snapshot directory: give 'snapshot_dir' or start with --snapshot-dir");
	struct snap_stats st;
	int r = snap_create(&sb->snap, full, &st, err, errlen);
	if (r) {
		sb->snaps_failed++;
		return r;
	}
	sb->snaps_taken++;
	log_snapshot(sb, &st);
	sandbox_merge_disks(sb, st.layer_id);
	*out = (struct api_snapshot_result){.layer_id = st.layer_id,
					    .full = st.full,
					    .compacted = st.compacted,
					    .staged = st.staged,
					    .pages = st.pages,
					    .stored = st.stored,
					    .bytes = st.bytes,
					    .precopy_us = st.precopy_us,
					    .pause_us = st.pause_us,
					    .write_us = st.write_us,
					    .total_us = st.total_us};
	return 0;
}

int sandbox_snapshot_now(struct sandbox *sb, char *err, size_t errlen)
{
	struct snap_stats st;
	int r;

	if (!sb->snap_ready)
		return errmsg(err, errlen, -EINVAL, "no snapshot directory");
	r = snap_create(&sb->snap, !sb->snap.have_base, &st, err, errlen);
	if (r) {
		sb->snaps_failed++;
		return r;
	}
	sb->snaps_taken++;
	log_snapshot(sb, &st);
	return 0;
}

static void on_api_request(void *opaque)
{
	idle_note_api(&sandbox_of(opaque)->idle);
}

/* Periodic snapshots: full the first time (and after a failure), incremental after. */
static void on_timer(void *opaque, uint32_t events)
{
	struct sandbox *sb = opaque;
	(void)events;
	uint64_t ticks;
	if (read(sb->timer_fd, &ticks, sizeof(ticks)) < 0)
		return;
	if (vm_get_state(&sb->vm) != VM_RUNNING)
		return;
	struct snap_stats st;
	char err[256];
	bool full = !sb->snap.have_base;
	int r = snap_create(&sb->snap, full, &st, err, sizeof(err));
	if (r) {
		sb->snaps_failed++;
		log_warn(&sb->log, "periodic snapshot failed (the previous one is intact): %s",
			 err);
		return;
	}
	sb->snaps_taken++;
	log_snapshot(sb, &st);
	sandbox_merge_disks(sb, st.layer_id);
}

/* Starts one `cove restore` of the layer just written, with its own sockets, CID and chain. */
static int spawn_clone(struct sandbox *sb, uint64_t layer, int k, struct api_clone *c,
		       int *ready_rd, int *pidfd_out)
{
	int g = sb->forks;
	if (snprintf(c->snapshot_dir, sizeof(c->snapshot_dir), "%s.fork%d-%d", sb->snap.dir, g,
		     k) >= (int)sizeof(c->snapshot_dir) ||
	    snprintf(c->console, sizeof(c->console), "%s.console", c->snapshot_dir) >=
		(int)sizeof(c->console))
		return -ENAMETOOLONG;
	if (sb->api_sock && snprintf(c->api_sock, sizeof(c->api_sock), "%s.fork%d-%d", sb->api_sock,
				     g, k) >= (int)sizeof(c->api_sock))
		return -ENAMETOOLONG;
	if (sb->mc.vsock_cid) {
		if (snprintf(c->vsock_uds, sizeof(c->vsock_uds), "%s.f%d-%d", sb->mc.vsock_uds, g,
			     k) > 96)
			return -ENAMETOOLONG;
		c->cid = sb->mc.vsock_cid + (uint64_t)(g * API_MAX_FORKS + k + 1);
		if (c->cid > UINT32_MAX)
			c->cid = 3 + (uint64_t)k;
	}
	int pfd[2];
	if (pipe2(pfd, O_CLOEXEC) < 0)
		return -errno;
	char layer_s[24], cid_s[24], ready_s[16];
	snprintf(layer_s, sizeof(layer_s), "%llu", (unsigned long long)layer);
	snprintf(cid_s, sizeof(cid_s), "%llu", (unsigned long long)c->cid);
	snprintf(ready_s, sizeof(ready_s), "%d", 3); /* the clone gets the pipe as fd 3 */
	const char *argv[28 + 2 * RUN_MAX_DISKS];
	char disk_arg[RUN_MAX_DISKS][RUN_DISK_PATH_MAX + 128];
	char vrate_s[24];
	int n = 0;
	argv[n++] = "cove";
	argv[n++] = "restore";
	argv[n++] = sb->snap.dir;
	argv[n++] = "--layer";
	argv[n++] = layer_s;
	argv[n++] = "--snapshot-dir";
	argv[n++] = c->snapshot_dir;
	argv[n++] = "--console";
	argv[n++] = c->console;
	char cmax[24];
	snprintf(cmax, sizeof(cmax), "%lluB", (unsigned long long)sb->console_max);
	argv[n++] = "--console-max";
	argv[n++] = cmax;
	argv[n++] = "--ready-fd";
	argv[n++] = ready_s;
	if (sb->exe_fd >= 0) {
		/* Jailed: no /proc for the clone to find its binary in; the spawner's fd 4. */
		argv[n++] = "--exe-fd";
		argv[n++] = "4";
	}
	/* The host's disks (a base, under an overlay): a clone takes no host path from the chain.
	 */
	for (int i = 0; i < sb->mc.nr_disks; i++) {
		clone_disk_arg(sb, i, disk_arg[i], sizeof(disk_arg[i]));
		argv[n++] = "--disk";
		argv[n++] = disk_arg[i];
	}
	if (sb->snap_root) {
		argv[n++] = "--snapshot-root";
		argv[n++] = sb->snap_root;
	}
	if (c->api_sock[0]) {
		argv[n++] = "--api-sock";
		argv[n++] = c->api_sock;
	}
	if (sb->snap.encrypted) {
		/* The parent's host-side provider: a clone never takes one from the chain. */
		argv[n++] = "--key";
		argv[n++] = sb->snap_key;
	}
	if (sb->mc.vsock_cid) {
		argv[n++] = "--vsock-uds";
		argv[n++] = c->vsock_uds;
		argv[n++] = "--vsock-cid";
		argv[n++] = cid_s;
		if (sb->mc.vsock_rate) {
			snprintf(vrate_s, sizeof(vrate_s), "%llu",
				 (unsigned long long)sb->mc.vsock_rate);
			argv[n++] = "--vsock-rate";
			argv[n++] = vrate_s;
		}
	}
	argv[n] = NULL;
	/* The spawner forks and execs: this process may not (seccomp). */
	int pid, pidfd;
	int r = spawner_spawn(&sb->spawner, argv, pfd[1], &pid, &pidfd);
	close(pfd[1]);
	if (r) {
		close(pfd[0]);
		return r;
	}
	c->pid = pid;
	*pidfd_out = pidfd;
	*ready_rd = pfd[0];
	return 0;
}

/*
 * Waits (up to CLONE_READY_S) for the clone to say it runs; its one-line error otherwise. A
 * clone restores in well under a second on hardware; the bound is for a loaded host (a jailed
 * clone in the emulated KVM box under a full CI took over 10 s), not the expected time.
 */
#define CLONE_READY_S 30
static int wait_ready(int fd, char *err, size_t errlen)
{
	char buf[256];
	size_t got = 0;
	uint64_t t0 = mono_ns();
	for (;;) {
		fd_set rs;
		FD_ZERO(&rs);
		FD_SET(fd, &rs);
		long left = CLONE_READY_S * 1000L - (long)((mono_ns() - t0) / 1000000);
		if (left <= 0)
			return errmsg(err, errlen, -ETIMEDOUT, "a clone did not start within %d s",
				      CLONE_READY_S);
		struct timeval tv = {left / 1000, (left % 1000) * 1000};
		int k = select(fd + 1, &rs, NULL, NULL, &tv);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			continue;
		ssize_t m = read(fd, buf + got, sizeof(buf) - 1 - got);
		if (m <= 0)
			break;
		got += (size_t)m;
		if (memchr(buf, '\n', got) || got == sizeof(buf) - 1)
			break;
	}
	buf[got] = 0;
	if (!strncmp(buf, "ok\n", 3))
		return 0;
	char *nl = strchr(buf, '\n');
	if (nl)
		*nl = 0;
	return errmsg(err, errlen, -EIO, "a clone failed to start: %s",
		      got ? buf : "it exited without a word");
}

/*
 * Clones are the spawner's children (it reaps them): forget the ones whose pidfd says they
 * exited.
 */
static void reap_clones(struct sandbox *sb)
{
	int kept = 0;
	for (int i = 0; i < sb->nr_clones; i++) {
		struct pollfd p = {.fd = sb->clone_pidfds[i], .events = POLLIN};
		if (poll(&p, 1, 0) == 0)
			sb->clone_pidfds[kept++] = sb->clone_pidfds[i];
		else
			close(sb->clone_pidfds[i]);
	}
	sb->nr_clones = kept;
}

/*
 * A clone must not go on with its parent's RNG state and clock: through the clone's guest
 * agent it gets a fresh seed, the host's clock and a new random broker token at epoch 0 (the
 * parent's grant is void; the host re-grants through cove-broker). The one place both
 * PUT /fork and `cove fork` (which calls PUT /fork) do this; the result goes in the reply.
 */
static void clone_identity(const struct api_clone *c, bool want, char *out, size_t cap)
{
	if (!want) {
		snprintf(out, cap, "not requested");
		return;
	}
	if (!c->vsock_uds[0]) {
		snprintf(out, cap,
			 "not delivered: the sandbox has no vsock device, so no guest agent "
			 "to take a new RNG seed and clock");
		return;
	}
	char err[200];
	if (agent_send_void_identity(c->vsock_uds, AGENT_IDENTITY_WAIT_S, err, sizeof(err)))
		snprintf(out, cap, "not delivered: %s", err);
	else
		snprintf(out, cap, "sent");
}

struct identity_job {
	struct api_clone *c;
	bool want, threaded;
};

static void *identity_thread(void *arg)
{
	struct identity_job *j = arg;
	pthread_setname_np(pthread_self(), "cove-identity");
	clone_identity(j->c, j->want, j->c->identity, sizeof(j->c->identity));
	return NULL;
}

static int be_fork(void *opaque, int count, bool identity, struct api_clone *out, char *err,
		   size_t errlen)
{
	struct sandbox *sb = sandbox_of(opaque);
	reap_clones(sb);
	if (sb->nr_clones + count > SANDBOX_MAX_CLONES)
		return errmsg(err, errlen, -EBUSY, "this sandbox already has %d running clones",
			      sb->nr_clones);
	if (!sb->snap_ready)
		return errmsg(err, errlen, -EINVAL,
			      "fork needs a snapshot directory (--snapshot-dir)");
	/* Clones map their layers whole: not while the restored ones still arrive from the store. */
	if (sb->snap.layers_arriving)
		return errmsg(err, errlen, -EBUSY,
			      "this sandbox's memory layers are still arriving from the store: fork "
			      "it once they are here (after its next stop and start)");
	/* A clone in the jail could not reach the key provider: the relay serves this VMM only. */
	if (sb->snap.encrypted && sb->key_relay_fd >= 0)
		return errmsg(err, errlen, -EOPNOTSUPP,
			      "a jailed sandbox with an encrypted chain cannot be forked yet");
	int r;
	struct snap_stats st;
	r = snap_create(&sb->snap, !sb->snap.have_base, &st, err, errlen);
	if (r)
		return r;
	log_snapshot(sb, &st);
	int fds[API_MAX_FORKS];
	int started = 0;
	for (int k = 0; k < count; k++) {
		int pidfd;
		r = spawn_clone(sb, st.layer_id, k, &out[k], &fds[k], &pidfd);
		if (r) {
			errmsg(err, errlen, r, "cannot start clone %d: %s", k, strerror(-r));
			break;
		}
		sb->clone_pidfds[sb->nr_clones++] = pidfd;
		started++;
	}
	/* Clones restore in parallel; wait for each to run. */
	for (int k = 0; k < started; k++) {
		char e2[256];
		int w = wait_ready(fds[k], e2, sizeof(e2));
		close(fds[k]);
		if (w && !r) {
			r = w;
			errmsg(err, errlen, w, "%s", e2);
		}
	}
	/*
	 * Ready means with a fresh identity: reported only after each clone got (or missed) it.
	 * Clones are reached in parallel, so N agentless guests cost one handshake deadline.
	 */
	pthread_t th[API_MAX_FORKS];
	struct identity_job jobs[API_MAX_FORKS];
	for (int k = 0; !r && k < started; k++) {
		jobs[k] = (struct identity_job){&out[k], identity, false};
		jobs[k].threaded = pthread_create(&th[k], NULL, identity_thread, &jobs[k]) == 0;
		if (!jobs[k].threaded)
			identity_thread(&jobs[k]);
	}
	for (int k = 0; !r && k < started; k++) {
		if (jobs[k].threaded)
			pthread_join(th[k], NULL);
		if (strcmp(out[k].identity, "sent"))
			log_warn(&sb->log, "fork: clone %d: identity %s", out[k].pid,
				 out[k].identity);
	}
	sb->forks++;
	return r;
}

int sandbox_serve(struct sandbox *sb, const char *api_sock)
{
	struct evloop *loop = &sb->vm.loop;
	sb->api_sock = api_sock;
	if (evloop_add(loop, sb->vm.stop_efd, EPOLLIN, on_stop, sb) ||
	    evloop_add(loop, sb->sig_fd, EPOLLIN, on_signal, sb)) {
		log_err(&sb->log, "cannot set up the event loop");
		return 1;
	}
	/* stdin may be a file or /dev/null, which epoll refuses: then there is no console input. */
	if (evloop_add(loop, STDIN_FILENO, EPOLLIN, on_stdin, sb))
		log_debug(&sb->log, "console input disabled (stdin cannot be polled)");
	if (sb->snap_ready && sb->snap_interval_ms) {
		sb->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
		struct itimerspec its = {0};
		its.it_interval.tv_sec = (time_t)(sb->snap_interval_ms / 1000);
		its.it_interval.tv_nsec = (long)(sb->snap_interval_ms % 1000) * 1000000;
		its.it_value = its.it_interval;
		if (sb->timer_fd < 0 || timerfd_settime(sb->timer_fd, 0, &its, NULL) < 0 ||
		    evloop_add(loop, sb->timer_fd, EPOLLIN, on_timer, sb)) {
			log_err(&sb->log, "cannot set up the snapshot timer");
			return 1;
		}
	}
	if (api_sock) {
		vm_api_backend(&sb->vm, &sb->be);
		sb->be.snapshot = be_snapshot;
		sb->be.fork = be_fork;
		sb->be.balloon_get = be_balloon_get;
		sb->be.balloon_set = be_balloon_set;
		sb->be.on_request = on_api_request;
		int r = api_server_start(&sb->api, api_sock, &sb->be, loop);
		if (r) {
			log_err(&sb->log, "cannot serve the API on %s: %s", api_sock, strerror(-r));
			return 1;
		}
	}
	if (idle_start(sb, loop))
		return 1;
	/* Restore's test hooks (NULL phase_dir: none): state applied, then vCPUs running. */
	if (phase_hook(sb->phase_dir, "state", &sb->log))
		return 1;
	/*
	 * Under seccomp nothing may run a key provider (exec, dlopen) after start: an encrypted
	 * chain's data key is unwrapped (or created and wrapped) now, once.
	 */
	if (sb->seccomp_on && sb->snap_ready && sb->snap.encrypted && !sb->snap.crypt.key) {
		char err[256];
		if (snap_crypt_open_key(&sb->snap.crypt, sb->snap.dir, sb->snap.prov, 1,
					sb->snap.inherit_key, err, sizeof(err))) {
			log_err(&sb->log, "%s", err);
			return 1;
		}
	}
	int r = vm_start(&sb->vm);
	if (sb->ready_fd >= 0) {
		if (r)
			dprintf(sb->ready_fd, "cannot start the vCPUs: %s\n", strerror(-r));
		else
			dprintf(sb->ready_fd, "ok\n");
		close(sb->ready_fd);
		sb->ready_fd = -1;
	}
	if (!r && phase_hook(sb->phase_dir, "started", &sb->log))
		vm_request_stop(&sb->vm, 1, "test phase hook failed");
	/* Last, on the main thread: threads the loop starts from now on inherit this filter. */
	if (!r && sb->seccomp_on) {
		char err[256];
		pthread_setname_np(pthread_self(), "cove-evloop");
		r = seccomp_install(SECCOMP_EVLOOP, err, sizeof(err));
		if (r)
			log_err(&sb->log, "%s", err);
		else
			seccomp_test_trigger(SECCOMP_EVLOOP);
	}
	if (!r)
		r = evloop_run(loop);
	if (r)
		vm_request_stop(&sb->vm, 1, "event loop failed: %s", strerror(-r));
	vm_join(&sb->vm);
	idle_stop_watch(sb);
	int status = sb->vm.exit.status;
	if (status)
		log_err(&sb->log, "%s", sb->vm.exit.reason);
	else
		log_info(&sb->log, "%s", sb->vm.exit.reason);
	if (sb->snaps_taken || sb->snaps_failed)
		log_info(&sb->log, "snapshots: %llu taken, %llu failed",
			 (unsigned long long)sb->snaps_taken, (unsigned long long)sb->snaps_failed);
	if (sb->api)
		api_server_stop(sb->api);
	sb->api = NULL;
	reap_clones(sb);
	return status;
}

void sandbox_destroy(struct sandbox *sb)
{
	for (int i = 0; i < sb->nr_clones; i++)
		close(sb->clone_pidfds[i]);
	sb->nr_clones = 0;
	spawner_stop(&sb->spawner);
	if (sb->snap_ready)
		snap_ctx_free(&sb->snap);
	layer_ring_free(sb->wring); /* after the snapshot context that borrowed it */
	sb->wring = NULL;
	sandbox_merges_free(sb);
	if (sb->board_created)
		board_destroy(&sb->board);
	if (sb->vm_created)
		vm_destroy(&sb->vm);
	/* After the disks: their frozen layers read through these. */
	for (int i = 0; i < sb->nr_sealers; i++)
		snap_sealer_free(sb->sealers[i]);
	sb->nr_sealers = 0;
	crypto_key_free(sb->data_key);
	sb->data_key = NULL;
	free(sb->config_json);
	if (sb->timer_fd >= 0)
		close(sb->timer_fd);
	if (sb->sig_fd >= 0)
		close(sb->sig_fd);
	if (sb->console_fd >= 0)
		close(sb->console_fd);
	if (sb->ready_fd >= 0)
		close(sb->ready_fd);
}
