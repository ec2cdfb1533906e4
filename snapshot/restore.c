/* Restore, snapshot side: open a chain layer, validate its memory layers, apply RAM and state. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <fcntl.h>

#include "common/errmsg.h"
#include "common/log.h"
#include "snapshot/digest.h"
#include "snapshot/board_state.h"
#include "snapshot/keyfile.h"
#include "snapshot/keyprov.h"
#include "snapshot/lazy_gate.h"
#include "snapshot/kvm_state.h"
#include "snapshot/restore.h"
#include "vmm/vm.h"

/* Picks the layer to restore: the latest, or the one the host named. */
static int pick_layer(struct snap_restore *sr, const struct snap_restore_args *a, char *err,
		      size_t errlen)
{
	sr->idx = sr->chain.nr_layers - 1;
	if (!a->layer)
		return 0;
	sr->idx = -1;
	for (int i = 0; i < sr->chain.nr_layers; i++)
		if (sr->chain.layers[i].id == a->layer)
			sr->idx = i;
	if (sr->idx < 0)
		return errmsg(err, errlen, -ENOENT, "the chain in %s has no layer %llu", a->dir,
			      (unsigned long long)a->layer);
	return 0;
}

static int open_key(struct snap_restore *sr, const struct snap_restore_args *a, char *err,
		    size_t errlen)
{
	struct keyprov *prov = NULL;
	/*
	 * The provider comes from the host, never from DIR/keys: a chain that could name
	 * its provider would run a command or load a module of its choosing.
	 */
	if (!a->key)
		return errmsg(err, errlen, -EINVAL,
			      "%s is an encrypted chain: give its key provider with --key "
			      "(the chain's keys file never chooses it)",
			      a->dir);
	if (keyprov_new_spec(a->key, &prov, err, errlen))
		return -EINVAL;
	if (a->key_relay > 2)
		keyprov_set_relay(prov, a->key_relay);
	/* The one place a revoked or deleted KEK shows: the provider refuses to unwrap. */
	int r = snap_crypt_open(&sr->crypt, a->dir, prov, 0, err, errlen);
	keyprov_free(prov);
	if (r)
		return r;
	if (memcmp(sr->crypt.chain_id, sr->chain.chain_id, 16))
		return errmsg(err, errlen, -EINVAL,
			      "%s/keys belongs to another chain than chain.json", a->dir);
	/* Continuing DIR takes layer ids from its counter: refuse a bad one now, not later. */
	bool continues = a->snap_dir ? !strcmp(a->snap_dir, a->dir) : snap_restore_is_latest(sr);
	if (continues && (r = keyfile_check_layer_ids(a->dir, err, errlen)))
		return r;
	return 0;
}

static void warn(const struct snap_restore_args *a, const char *msg)
{
	struct logger l = {.level = LOG_WARN, .out = stderr, .name = NULL};
	log_warn(a->log ? a->log : &l, "%s", msg);
}

/* The digest of what was read (or of the open file) against the chain's, by file name. */
static int check_digest(const struct snap_restore *sr, const char *dir, const char *name,
			const uint8_t got[DIGEST_LEN], char *err, size_t errlen)
{
	const uint8_t *want = chain_digest_get(&sr->chain, name);
	if (!want)
		return errmsg(err, errlen, -EBADMSG,
			      "%s: %s: no SHA-256 in the chain for a file the restore uses "
			      "(altered chain file)",
			      dir, name);
	if (memcmp(want, got, DIGEST_LEN))
		return errmsg(err, errlen, -EBADMSG,
			      "%s: %s: SHA-256 does not match the chain (the file changed after "
			      "its commit)",
			      dir, name);
	return 0;
}

/* Reads, decrypts and parses the layer's state file; it must hold a machine description. */
static int open_state(struct snap_restore *sr, const struct snap_restore_args *a, const char *path,
		      char *err, size_t errlen)
{
	int r = state_read_file(path, &sr->state, &sr->state_len, err, errlen);
	if (r)
		return r;
	/* The bytes parsed are the bytes checked: a state file with valid CRCs is not enough. */
	if (sr->chain.has_digests && !a->digests_checked) {
		uint8_t d[DIGEST_LEN];
		r = digest_buf(sr->state, sr->state_len, d);
		if (r)
			return errmsg(err, errlen, r, "%s: digest: %s", path, strerror(-r));
		r = check_digest(sr, a->dir, sr->chain.layers[sr->idx].state, d, err, errlen);
		if (r)
			return r;
	}
	char e2[200];
	if (sr->encrypted != snap_state_is_encrypted(sr->state, sr->state_len))
		return errmsg(err, errlen, -EINVAL, "%s: the state file is %s but the chain is %s",
			      path, sr->encrypted ? "plain" : "encrypted",
			      sr->encrypted ? "encrypted" : "not");
	if (sr->encrypted) {
		uint8_t *plain;
		size_t plen;
		r = snap_crypt_open_state(&sr->crypt, sr->chain.layers[sr->idx].id, sr->state,
					  sr->state_len, &plain, &plen, e2, sizeof(e2));
		if (r)
			return errmsg(err, errlen, r, "%s: %s", path, e2);
		free(sr->state);
		sr->state = plain;
		sr->state_len = plen;
	}
	r = state_parse(sr->state, sr->state_len, &sr->secs, &sr->nsecs, e2, sizeof(e2));
	if (r)
		return errmsg(err, errlen, r, "%s: %s", path, e2);
	sr->config = state_find(sr->secs, sr->nsecs, SEC_CONFIG, 0);
	if (!sr->config)
		return errmsg(err, errlen, -EINVAL, "%s: no machine description", path);
	return 0;
}

int snap_restore_open(struct snap_restore *sr, const struct snap_restore_args *a, char *err,
		      size_t errlen)
{
	sr->lazy_fd = a->lazy_fd > 2 ? a->lazy_fd : -1;
	int r = chain_load(a->dir, &sr->chain, err, errlen);
	if (r == -ENOENT)
		return errmsg(err, errlen, r, "%s holds no snapshot chain (no chain.json)", a->dir);
	if (r)
		return r;
	if (sr->chain.warning[0])
		warn(a, sr->chain.warning);
	if (!sr->chain.nr_layers)
		return errmsg(err, errlen, -EINVAL, "the chain in %s has no layers", a->dir);
	r = pick_layer(sr, a, err, errlen);
	if (r)
		return r;
	char path[4200];
	snprintf(path, sizeof(path), "%s/%s", a->dir, KEYFILE_NAME);
	sr->encrypted = access(path, F_OK) == 0;
	if (sr->encrypted && (r = open_key(sr, a, err, errlen)))
		return r;
	snprintf(path, sizeof(path), "%s/%s", a->dir, sr->chain.layers[sr->idx].state);
	return open_state(sr, a, path, err, errlen);
}

/*
 * Every file the restore uses against its recorded digest, before the guest runs: memory
 * layers 0..idx (their open fds, the ones RAM is built from), then the frozen disk layers
 * and maps the machine description names (beneath the directory, never through a link).
 * The state file was checked as it was read.
 */
static int verify_digests(struct snap_restore *sr, const struct snap_restore_args *a, char *err,
			  size_t errlen)
{
	if (!sr->chain.has_digests) {
		char msg[4400];
		snprintf(msg, sizeof(msg),
			 "%s: the chain records no SHA-256 digests (written before cove recorded "
			 "them): its files are not checked; the next snapshot records them",
			 a->dir);
		warn(a, msg);
		sr->unverified = true;
		return 0;
	}
	if (a->digests_checked)
		return 0;
	uint8_t d[DIGEST_LEN];
	int r = 0;
	/* Arriving from the store: the fetcher checks each chunk against the chain's digest. */
	for (int i = 0; !r && sr->lazy_fd < 0 && i < sr->ls->nr; i++) {
		r = digest_fd(sr->ls->layers[i].fd, d);
		if (r)
			return errmsg(err, errlen, r, "%s/%s: cannot read it: %s", a->dir,
				      sr->chain.layers[i].mem, strerror(-r));
		r = check_digest(sr, a->dir, sr->chain.layers[i].mem, d, err, errlen);
	}
	if (r)
		return r;
	char(*names)[64] = malloc(CHAIN_MAX_DIGESTS * sizeof(*names));
	if (!names)
		return -ENOMEM;
	int n = 0;
	r = digest_config_files((const char *)sr->config->payload, sr->config->len, names,
				CHAIN_MAX_DIGESTS, &n);
	if (r)
		errmsg(err, errlen, r, "%s/%s: the machine description names bad disk layers",
		       a->dir, sr->chain.layers[sr->idx].state);
	int dfd = r ? -1 : open(a->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (!r && dfd < 0)
		r = errmsg(err, errlen, -errno, "%s: %s", a->dir, strerror(errno));
	for (int i = 0; !r && i < n; i++) {
		r = digest_file_at(dfd, names[i], d);
		if (r == -ELOOP)
			errmsg(err, errlen, r,
			       "%s/%s: a link where a chain file should be, refused", a->dir,
			       names[i]);
		else if (r)
			errmsg(err, errlen, r, "%s/%s: cannot read it: %s", a->dir, names[i],
			       strerror(-r));
		else
			r = check_digest(sr, a->dir, names[i], d, err, errlen);
	}
	if (dfd >= 0)
		close(dfd);
	free(names);
	return r;
}

int snap_restore_validate(struct snap_restore *sr, const struct snap_restore_args *a, char *err,
			  size_t errlen)
{
	sr->ls = calloc(1, sizeof(*sr->ls));
	if (!sr->ls)
		return -ENOMEM;
	int r = layer_set_open(sr->ls, &sr->chain, sr->idx, err, errlen);
	if (r)
		return r;
	for (int i = 0; i < sr->ls->nr; i++) {
		const struct mem_layer *l = &sr->ls->layers[i];
		bool enc = l->info.flags & MEM_LAYER_ENCRYPTED;
		if (enc != sr->encrypted)
			return errmsg(err, errlen, -EINVAL,
				      "%s/%s: layer is %s but the chain is %s", a->dir,
				      sr->chain.layers[i].mem, enc ? "encrypted" : "plain",
				      sr->encrypted ? "encrypted" : "not");
		if (enc && snap_crypt_check_layer(&sr->crypt, l))
			return errmsg(err, errlen, -EBADMSG,
				      "%s/%s: header or page bitmap failed authentication", a->dir,
				      sr->chain.layers[i].mem);
	}
	r = verify_digests(sr, a, err, errlen);
	if (r)
		return r;
	if (sr->encrypted && a->verify)
		return lazy_mem_verify_all(sr->ls, &sr->crypt, err, errlen);
	return 0;
}

void snap_restore_close(struct snap_restore *sr)
{
	if (sr->ls) {
		layer_set_close(sr->ls);
		free(sr->ls);
		sr->ls = NULL;
	}
	snap_crypt_close(&sr->crypt);
	if (sr->lazy_fd > 2)
		close(sr->lazy_fd);
	sr->lazy_fd = -1;
	free(sr->secs);
	free(sr->state);
	sr->secs = NULL;
	sr->state = NULL;
	sr->config = NULL;
}

bool snap_restore_is_latest(const struct snap_restore *sr)
{
	return sr->idx == sr->chain.nr_layers - 1;
}

void snap_restore_ram_backing(const struct snap_restore *sr, int *fd, uint64_t *off)
{
	*fd = -1;
	*off = 0;
	if (!sr->encrypted && sr->lazy_fd < 0) {
		*fd = sr->ls->layers[0].fd;
		*off = sr->ls->layers[0].info.data_off;
	}
}

int snap_restore_apply_ram(struct snap_restore *sr, struct vm *vm, struct lazy_mem *lm,
			   uint64_t *pages_copied, char *err, size_t errlen)
{
	*pages_copied = 0;
	if (sr->encrypted || sr->lazy_fd >= 0) {
		struct lazy_gate *g = NULL;
		if (sr->lazy_fd >= 0) {
			uint64_t sizes[CHAIN_MAX_LAYERS];
			for (int i = 0; i < sr->ls->nr; i++)
				sizes[i] = mem_layer_file_size(&sr->ls->layers[i].info);
			g = lazy_gate_new(sr->lazy_fd, &sr->chain, sr->ls->nr, sizes);
			if (!g)
				return errmsg(err, errlen, -ENOMEM, "out of memory");
			sr->lazy_fd = -1; /* the gate's now */
		}
		int r = lazy_mem_start(lm, vm, sr->ls, sr->encrypted ? &sr->crypt : NULL, g, err,
				       errlen);
		if (r)
			return r;
		sr->ls = NULL; /* the lazy thread owns the layers now */
		return 0;
	}
	int r = layer_set_apply(sr->ls, vm->mem.host, pages_copied);
	if (r)
		return errmsg(err, errlen, r, "cannot read the memory layers: %s", strerror(-r));
	return 0;
}

int snap_restore_apply_state(const struct snap_restore *sr, struct vm *vm, struct board *board,
			     char *err, size_t errlen)
{
	int r = kvm_state_restore(vm, sr->secs, sr->nsecs, err, errlen);
	if (r)
		return r;
	return board_restore(board, sr->secs, sr->nsecs, err, errlen);
}
