/* `cove restore DIR`: rebuild a sandbox from a snapshot chain in a new process; RAM is mapped lazily, the guest runs at once. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "snapshot/board_state.h"
#include "snapshot/chain.h"
#include "cli/commands.h"
#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "snapshot/keyfile.h"
#include "snapshot/keyprov.h"
#include "snapshot/kvm_state.h"
#include "snapshot/lazy_mem.h"
#include "snapshot/layer_restore.h"
#include "sandbox/machine_config.h"
#include "sandbox/options.h"
#include "devices/overlay.h"
#include "sandbox/sandbox.h"
#include "snapshot/state_file.h"
#include "devices/virtio_blk.h"

static const char restore_usage[] =
	"usage: cove restore DIR [options]\n"
	"Start a sandbox from the snapshot chain in DIR (the latest layer unless --layer).\n"
	"Memory is mapped from the layer files and read only when the guest touches it.\n"
	"\n"
	"  --layer ID          restore this layer instead of the latest\n"
	"  --api-sock PATH     serve the control API on this Unix socket\n"
	"  --console FILE      serial console to FILE instead of stdout\n"
	"  --console-max SIZE  as for cove run (default 64M)\n"
	"  --disk PATH[,ro]    the host file for each disk the snapshot has, in order (as in cove\n"
	"                      run; size and ro must match the saved disk). For a disk that was\n"
	"                      under an overlay give its base; its frozen layers are in DIR and\n"
	"                      its new top goes into the snapshot directory\n"
	"  --vsock-uds PATH    host side of vsock: required when the snapshot has a vsock device\n"
	"  --vsock-cid N       the guest's new context id (the guest re-reads it)\n"
	"  --snapshot-dir DIR2 where this sandbox's snapshots go (default: DIR when restoring the\n"
	"                      latest layer, continuing its chain incrementally)\n"
	"  --snapshot-interval T, --snapshot-keep N, --snapshot-root DIR   as for cove run\n"
	"  --key SPEC          key provider of an encrypted chain (required for one: it must be\n"
	"                      the provider DIR/keys records; PKCS#11 PINs come from\n"
	"                      COVE_PKCS11_PIN or pin-file=)\n"
	"  --verify            encrypted chain: authenticate every stored page and sealed disk\n"
	"                      chunk before the guest runs (otherwise each page is checked when\n"
	"                      first touched, and a bad one stops the VM; a bad disk chunk is an\n"
	"                      I/O error to the guest)\n"
	"  --ready-fd N        write \"ok\\n\" (or a one-line error) to fd N once the vCPUs run\n"
	"  --log-level LEVEL   error|warn|info|debug (default warn)\n"
	"\n"
	"Exit status: as cove run; 1 with one line on stderr if the snapshot cannot be used.\n";

struct restore_opts {
	const char *dir;
	uint64_t layer; /* 0: latest */
	const char *api_sock, *console, *vsock_uds, *snap_dir, *snap_root;
	uint64_t vsock_cid, interval_ms;
	int keep;
	int ready_fd;
	enum log_level level;
	const char *key;
	bool verify;
	int nr_disks;
	struct disk_opt disks[RUN_MAX_DISKS]; /* host paths: restore takes none from the chain */
	uint64_t console_max;
};

enum { O_LAYER = 256, O_API, O_CONSOLE, O_UDS, O_CID, O_SDIR, O_SINT, O_SKEEP, O_READY, O_LOG,
       O_KEY, O_VERIFY, O_DISK, O_SROOT, O_CMAX };

static const struct option long_opts[] = {
	{ "layer", required_argument, NULL, O_LAYER },
	{ "api-sock", required_argument, NULL, O_API },
	{ "console", required_argument, NULL, O_CONSOLE },
	{ "vsock-uds", required_argument, NULL, O_UDS },
	{ "vsock-cid", required_argument, NULL, O_CID },
	{ "snapshot-dir", required_argument, NULL, O_SDIR },
	{ "snapshot-interval", required_argument, NULL, O_SINT },
	{ "snapshot-keep", required_argument, NULL, O_SKEEP },
	{ "ready-fd", required_argument, NULL, O_READY },
	{ "log-level", required_argument, NULL, O_LOG },
	{ "key", required_argument, NULL, O_KEY },
	{ "verify", no_argument, NULL, O_VERIFY },
	{ "disk", required_argument, NULL, O_DISK },
	{ "snapshot-root", required_argument, NULL, O_SROOT },
	{ "console-max", required_argument, NULL, O_CMAX },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

static int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || *end || *s == '-' || v < lo || v > hi)
		return -EINVAL;
	*out = v;
	return 0;
}

static int parse_opts(int argc, char **argv, struct restore_opts *o, char *err, size_t errlen)
{
	memset(o, 0, sizeof(*o));
	o->ready_fd = -1;
	o->level = LOG_WARN;
	optind = 0;
	opterr = 0;
	uint64_t v;
	for (;;) {
		int c = getopt_long(argc, argv, ":h", long_opts, NULL);
		if (c == -1)
			break;
		switch (c) {
		case 'h':
			return 1;
		case O_LAYER:
			if (parse_u64(optarg, 1, UINT64_MAX, &o->layer))
				return errmsg(err, errlen, -EINVAL, "--layer: '%s' is not a layer id", optarg);
			break;
		case O_API:
			o->api_sock = optarg;
			break;
		case O_CONSOLE:
			o->console = optarg;
			break;
		case O_UDS:
			if (opt_vsock_uds(optarg, err, errlen))
				return -EINVAL;
			o->vsock_uds = optarg;
			break;
		case O_CID:
			if (opt_vsock_cid(optarg, &o->vsock_cid, err, errlen))
				return -EINVAL;
			break;
		case O_SDIR:
			if (opt_snapshot_dir(optarg, err, errlen))
				return -EINVAL;
			o->snap_dir = optarg;
			break;
		case O_CMAX:
			if (opt_console_max(optarg, &o->console_max, err, errlen))
				return -EINVAL;
			break;
		case O_SROOT:
			if (opt_snapshot_root(optarg, err, errlen))
				return -EINVAL;
			o->snap_root = optarg;
			break;
		case O_SINT:
			if (opt_snapshot_interval(optarg, &o->interval_ms, err, errlen))
				return -EINVAL;
			break;
		case O_SKEEP:
			if (opt_snapshot_keep(optarg, &o->keep, err, errlen))
				return -EINVAL;
			break;
		case O_READY:
			if (parse_u64(optarg, 3, 1 << 20, &v))
				return errmsg(err, errlen, -EINVAL, "--ready-fd: '%s' is not a file descriptor", optarg);
			o->ready_fd = (int)v;
			break;
		case O_LOG:
			if (opt_log_level(optarg, &o->level, err, errlen))
				return -EINVAL;
			break;
		case O_KEY:
			if (opt_key_spec("--key", optarg, err, errlen))
				return -EINVAL;
			o->key = optarg;
			break;
		case O_VERIFY:
			o->verify = true;
			break;
		case O_DISK:
			if (o->nr_disks >= RUN_MAX_DISKS)
				return errmsg(err, errlen, -EINVAL, "--disk: at most %d disks", RUN_MAX_DISKS);
			if (parse_disk_opt(optarg, &o->disks[o->nr_disks], err, errlen))
				return -EINVAL;
			o->nr_disks++;
			break;
		case ':':
			return errmsg(err, errlen, -EINVAL, "option '%s' needs a value", argv[optind - 1]);
		default:
			return errmsg(err, errlen, -EINVAL, "unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind != argc - 1)
		return errmsg(err, errlen, -EINVAL, optind >= argc ? "the chain directory DIR is required"
								   : "unexpected argument '%s'",
			      optind < argc ? argv[optind + 1] : "");
	o->dir = argv[optind];
	if (o->vsock_cid && !o->vsock_uds)
		return errmsg(err, errlen, -EINVAL, "--vsock-cid needs --vsock-uds (a clone's own socket)");
	return 0;
}

static uint64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

/* Everything about the snapshot that can be checked without a VM, checked before one exists. */
struct plan {
	struct chain chain;
	int idx;
	struct layer_set *ls;
	bool encrypted;
	struct snap_crypt crypt;
	uint8_t *state;
	size_t state_len;
	struct state_section_ref *secs;
	size_t nsecs;
	struct machine_config mc;
};

/*
 * Host paths come from the host: each saved disk from --disk (by index, size and ro), frozen
 * overlay layers by their plain names inside DIR, the vsock socket from --vsock-uds. The state
 * file only says what the machine had.
 */
static int plan_host_paths(struct plan *p, const struct restore_opts *o, char *err, size_t errlen)
{
	struct machine_config *mc = &p->mc;
	for (int i = 0; i < mc->nr_disks; i++) {
		bool ovl = mc->disks[i].overlay[0];
		if (i >= o->nr_disks)
			return errmsg(err, errlen, -EINVAL,
				      "the snapshot has disk %d (/dev/vd%c, %llu bytes%s): give its "
				      "host file with --disk PATH%s",
				      i, 'a' + i, (unsigned long long)mc->disk_size[i],
				      mc->disks[i].read_only ? ", read-only"
				      : ovl		     ? ", the base under an overlay"
							     : "",
				      mc->disks[i].read_only ? ",ro" : "");
		const struct disk_opt *h = &o->disks[i];
		if (h->overlay[0])
			return errmsg(err, errlen, -EINVAL,
				      "--disk %s: restore does not take overlay= (a disk's frozen "
				      "layers are in %s, its new top goes into the snapshot directory)",
				      h->path, o->dir);
		if (h->read_only != mc->disks[i].read_only)
			return errmsg(err, errlen, -EINVAL, "--disk %s: disk %d was saved %s, give it %s",
				      h->path, i, mc->disks[i].read_only ? "read-only" : "writable",
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
		for (int k = 0; k < mc->chains[i].n; k++) {
			char *lp = mc->chains[i].paths[k];
			char name[256]; /* a plain name (machine_config_parse): at most 255 bytes */
			size_t nl = strlen(lp);
			if (nl >= sizeof(name))
				return errmsg(err, errlen, -EINVAL, "disk %d: layer name too long", i);
			memcpy(name, lp, nl + 1);
			if (snprintf(lp, sizeof(mc->chains[i].paths[k]), "%s/%s", o->dir, name) >=
			    (int)sizeof(mc->chains[i].paths[k]))
				return errmsg(err, errlen, -ENAMETOOLONG, "%s: path too long", o->dir);
		}
	}
	if (o->nr_disks > mc->nr_disks)
		return errmsg(err, errlen, -EINVAL, "--disk %s: the snapshot has only %d disk(s)",
			      o->disks[mc->nr_disks].path, mc->nr_disks);
	if (mc->vsock_cid && !o->vsock_uds)
		return errmsg(err, errlen, -EINVAL,
			      "the snapshot has a vsock device (CID %llu): give its host socket with "
			      "--vsock-uds PATH",
			      (unsigned long long)mc->vsock_cid);
	if (!mc->vsock_cid && o->vsock_uds)
		return errmsg(err, errlen, -EINVAL, "--vsock-uds: the snapshot has no vsock device");
	return 0;
}

static int plan_load(struct plan *p, const struct restore_opts *o, char *err, size_t errlen)
{
	int r = chain_load(o->dir, &p->chain, err, errlen);
	if (r == -ENOENT)
		return errmsg(err, errlen, r, "%s holds no snapshot chain (no chain.json)", o->dir);
	if (r)
		return r;
	if (!p->chain.nr_layers)
		return errmsg(err, errlen, -EINVAL, "the chain in %s has no layers", o->dir);
	p->idx = p->chain.nr_layers - 1;
	if (o->layer) {
		p->idx = -1;
		for (int i = 0; i < p->chain.nr_layers; i++)
			if (p->chain.layers[i].id == o->layer)
				p->idx = i;
		if (p->idx < 0)
			return errmsg(err, errlen, -ENOENT, "the chain in %s has no layer %llu", o->dir,
				      (unsigned long long)o->layer);
	}
	char path[4200];
	snprintf(path, sizeof(path), "%s/%s", o->dir, KEYFILE_NAME);
	p->encrypted = access(path, F_OK) == 0;
	if (p->encrypted) {
		struct keyprov *prov = NULL;
		/*
		 * The provider comes from the host, never from DIR/keys: a chain that could name
		 * its provider would run a command or load a module of its choosing.
		 */
		if (!o->key)
			return errmsg(err, errlen, -EINVAL,
				      "%s is an encrypted chain: give its key provider with --key "
				      "(the chain's keys file never chooses it)",
				      o->dir);
		if (keyprov_new_spec(o->key, &prov, err, errlen))
			return -EINVAL;
		/* The one place a revoked or deleted KEK shows: the provider refuses to unwrap. */
		r = snap_crypt_open(&p->crypt, o->dir, prov, 0, err, errlen);
		keyprov_free(prov);
		if (r)
			return r;
		if (memcmp(p->crypt.chain_id, p->chain.chain_id, 16))
			return errmsg(err, errlen, -EINVAL,
				      "%s/keys belongs to another chain than chain.json", o->dir);
		/* Continuing DIR takes layer ids from its counter: refuse a bad one now, not later.
		 */
		bool continues =
		    o->snap_dir ? !strcmp(o->snap_dir, o->dir) : p->idx == p->chain.nr_layers - 1;
		if (continues && (r = keyfile_check_layer_ids(o->dir, err, errlen)))
			return r;
	}
	snprintf(path, sizeof(path), "%s/%s", o->dir, p->chain.layers[p->idx].state);
	r = state_read_file(path, &p->state, &p->state_len, err, errlen);
	if (r)
		return r;
	char e2[200];
	if (p->encrypted != snap_state_is_encrypted(p->state, p->state_len))
		return errmsg(err, errlen, -EINVAL, "%s: the state file is %s but the chain is %s",
			      path, p->encrypted ? "plain" : "encrypted",
			      p->encrypted ? "encrypted" : "not");
	if (p->encrypted) {
		uint8_t *plain;
		size_t plen;
		r = snap_crypt_open_state(&p->crypt, p->chain.layers[p->idx].id, p->state,
					  p->state_len, &plain, &plen, e2, sizeof(e2));
		if (r)
			return errmsg(err, errlen, r, "%s: %s", path, e2);
		free(p->state);
		p->state = plain;
		p->state_len = plen;
	}
	r = state_parse(p->state, p->state_len, &p->secs, &p->nsecs, e2, sizeof(e2));
	if (r)
		return errmsg(err, errlen, r, "%s: %s", path, e2);
	const struct state_section_ref *cfg = state_find(p->secs, p->nsecs, SEC_CONFIG, 0);
	if (!cfg)
		return errmsg(err, errlen, -EINVAL, "%s: no machine description", path);
	r = machine_config_parse((const char *)cfg->payload, cfg->len, &p->mc, err, errlen);
	if (r)
		return r;
	if (p->mc.mem_size != p->chain.ram_size)
		return errmsg(err, errlen, -EINVAL, "%s: RAM size differs from the chain's", path);
	r = plan_host_paths(p, o, err, errlen);
	if (r)
		return r;
	p->ls = calloc(1, sizeof(*p->ls));
	if (!p->ls)
		return -ENOMEM;
	r = layer_set_open(p->ls, &p->chain, p->idx, err, errlen);
	if (r)
		return r;
	for (int i = 0; i < p->ls->nr; i++) {
		const struct mem_layer *l = &p->ls->layers[i];
		bool enc = l->info.flags & MEM_LAYER_ENCRYPTED;
		if (enc != p->encrypted)
			return errmsg(err, errlen, -EINVAL, "%s/%s: layer is %s but the chain is %s",
				      o->dir, p->chain.layers[i].mem, enc ? "encrypted" : "plain",
				      p->encrypted ? "encrypted" : "not");
		if (enc && snap_crypt_check_layer(&p->crypt, l))
			return errmsg(err, errlen, -EBADMSG,
				      "%s/%s: header or page bitmap failed authentication", o->dir,
				      p->chain.layers[i].mem);
	}
	if (p->encrypted && o->verify)
		return lazy_mem_verify_all(p->ls, &p->crypt, err, errlen);
	return 0;
}

static void plan_free(struct plan *p)
{
	if (p->ls) {
		layer_set_close(p->ls);
		free(p->ls);
	}
	snap_crypt_close(&p->crypt);
	free(p->secs);
	free(p->state);
}

/*
 * Frozen disk layers of an encrypted chain are sealed: authenticate every map (and with
 * --verify every chunk) before the guest runs; a layer in clear there, or a sealed one in a
 * plain chain, is refused. One line in err.
 */
static int check_disk_layers(struct sandbox *sb, struct plan *p, const struct restore_opts *o,
			     char *err, size_t errlen)
{
	for (int i = 0; i < board_count(&sb->board, &virtio_blk_type); i++) {
		struct virtio_blk *disk = board_nth(&sb->board, &virtio_blk_type, i);
		struct overlay *ov = disk ? disk->ov : NULL;
		int sealed, plain;
		if (!ov)
			continue;
		overlay_count_sealed(ov, &sealed, &plain);
		if (p->encrypted && plain)
			return errmsg(
			    err, errlen, -EBADMSG,
			    "disk %d: %d frozen overlay layer(s) in clear in an encrypted "
			    "chain (altered, or not this chain's)",
			    i, plain);
		if (!p->encrypted && sealed)
			return errmsg(
			    err, errlen, -EINVAL,
			    "disk %d: sealed overlay layers in a chain that is not encrypted", i);
		if (!sealed)
			continue;
		const struct overlay_sealer *s = sandbox_sealer(sb, &p->crypt);
		if (!s)
			return errmsg(err, errlen, -ENOMEM, "cannot set up sealing of disk layers");
		int r = overlay_attach_sealer(ov, s, err, errlen);
		if (!r && o->verify)
			r = overlay_verify_sealed(ov, err, errlen);
		if (r)
			return r;
	}
	return 0;
}

static int restore_and_serve(struct sandbox *sb, struct plan *p, const struct restore_opts *o,
			     struct lazy_mem *lm)
{
	char err[512];
	uint64_t t0 = now_us();
	if (o->vsock_uds) {
		snprintf(p->mc.vsock_uds, sizeof(p->mc.vsock_uds), "%s", o->vsock_uds);
		if (o->vsock_cid)
			p->mc.vsock_cid = o->vsock_cid;
	}
	bool latest = p->idx == p->chain.nr_layers - 1;
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
	for (int i = 0; i < p->mc.nr_disks; i++) {
		if (!p->mc.disks[i].overlay[0])
			continue;
		if (snprintf(p->mc.disks[i].overlay, sizeof(p->mc.disks[i].overlay),
			     "%s/disk%d-r%06llu-%d.ovl", topdir, i,
			     (unsigned long long)p->chain.layers[p->idx].id, (int)getpid()) >=
		    (int)sizeof(p->mc.disks[i].overlay)) {
			log_err(&sb->log, "disk overlay path too long");
			return 1;
		}
	}
	const struct mem_layer *base = &p->ls->layers[0];
	uint64_t copied = 0;
	int nr_layers = p->ls->nr;
	int r;
	/* Logging from the start: the restored sandbox can go on with incremental snapshots. */
	if (p->encrypted) {
		/* Ciphertext cannot be mapped: a fresh RAM that userfaultfd fills page by page. */
		if (sandbox_build(sb, &p->mc, true, -1, 0))
			return 1;
		r = lazy_mem_start(lm, &sb->vm, p->ls, &p->crypt, err, sizeof(err));
		if (r) {
			log_err(&sb->log, "%s", err);
			return 1;
		}
		p->ls = NULL; /* the lazy thread owns the layers now */
	} else {
		if (sandbox_build(sb, &p->mc, true, base->fd, base->info.data_off))
			return 1;
		r = layer_set_apply(p->ls, sb->vm.mem.host, &copied);
		if (r) {
			log_err(&sb->log, "cannot read the memory layers: %s", strerror(-r));
			return 1;
		}
	}
	if (check_disk_layers(sb, p, o, err, sizeof(err))) {
		log_err(&sb->log, "%s", err);
		return 1;
	}
	if (kvm_state_restore(&sb->vm, p->secs, p->nsecs, err, sizeof(err)) ||
	    board_restore(&sb->board, p->secs, p->nsecs, err, sizeof(err))) {
		log_err(&sb->log, "%s", err);
		return 1;
	}
	board_resume_restored(&sb->board, &sb->log);
	/* Chains this sandbox writes keep this chain's data key: they share its disk layers. */
	if (p->encrypted && sandbox_keep_data_key(sb, p->crypt.key)) {
		log_err(&sb->log, "out of memory");
		return 1;
	}
	if (sdir) {
		/* Encrypted: the host's --key (plan_load required it), for this or a new chain. */
		if (p->encrypted)
			sb->snap_key = o->key;
		if (sandbox_snapshots(sb, sdir, o->interval_ms, o->keep))
			return 1;
		sb->snap.ram_lazy = p->encrypted;
		/* Same chain, latest layer: the next snapshot may be incremental. */
		if (!strcmp(sdir, o->dir) && latest)
			snap_ctx_adopt_chain(&sb->snap, &p->chain);
	} else if (o->interval_ms) {
		log_err(&sb->log, "--snapshot-interval needs --snapshot-dir when restoring an older layer");
		return 1;
	}
	log_info(&sb->log,
		 "restored layer %llu of %s: %d layer(s)%s, %llu increment pages copied, %llu us",
		 (unsigned long long)p->chain.layers[p->idx].id, o->dir, nr_layers,
		 p->encrypted ? ", encrypted (pages decrypted on first touch)" : "",
		 (unsigned long long)copied, (unsigned long long)(now_us() - t0));
	if (p->ls)
		layer_set_close(p->ls);
	sb->ready_fd = o->ready_fd;
	sb->snap_root = o->snap_root;
	return sandbox_serve(sb, o->api_sock);
}

int cmd_restore(int argc, char **argv)
{
	struct restore_opts o;
	char err[512];
	int r = parse_opts(argc, argv, &o, err, sizeof(err));
	if (r == 1) {
		fputs(restore_usage, stdout);
		return 0;
	}
	if (r) {
		fprintf(stderr, "cove restore: %s (try 'cove restore --help')\n", err);
		return 2;
	}
	struct plan *p = calloc(1, sizeof(*p));
	struct sandbox *sb = calloc(1, sizeof(*sb));
	int status = 1;
	if (!p || !sb) {
		fprintf(stderr, "cove restore: out of memory\n");
		goto out;
	}
	r = plan_load(p, &o, err, sizeof(err));
	if (r) {
		fprintf(stderr, "cove restore: %s\n", err);
		if (o.ready_fd >= 0)
			dprintf(o.ready_fd, "%s\n", err);
		goto out;
	}
	struct lazy_mem lm = { .uffd = -1, .stop_efd = -1 };
	if (sandbox_init(sb, o.console, o.console_max, o.level) == 0)
		status = restore_and_serve(sb, p, &o, &lm);
	/* The lazy thread may be blocked serving RAM the vCPUs touch: stop it after them. */
	lazy_mem_stop(&lm);
	if (status && sb->ready_fd < 0 && o.ready_fd >= 0 && vm_get_state(&sb->vm) == VM_NOT_STARTED)
		dprintf(o.ready_fd, "restore failed (see its log)\n");
	sandbox_destroy(sb);
out:
	if (p)
		plan_free(p);
	free(p);
	free(sb);
	return status;
}
