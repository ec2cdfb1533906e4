/* A snapshot chain directory: generation files list the layers and their digests; creating one is
 * the commit point. */
#include "snapshot/chain.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "common/fd_io.h"
#include "common/file_io.h"
#include "snapshot/digest.h"
#include "snapshot/keyfile.h"

void chain_id_hex(const uint8_t id[16], char out[33])
{
	for (int i = 0; i < 16; i++)
		snprintf(out + 2 * i, 3, "%02x", id[i]);
}

static int unhex(const char *s, uint8_t out[16])
{
	if (strlen(s) != 32)
		return -EINVAL;
	for (int i = 0; i < 32; i++)
		if (!isxdigit((unsigned char)s[i]))
			return -EINVAL;
	for (int i = 0; i < 16; i++) {
		unsigned v;
		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			return -EINVAL;
		out[i] = (uint8_t)v;
	}
	return 0;
}

/* A file name inside the chain directory (dirfd_io.h), short enough for struct chain_layer. */
static bool plain_name(const char *s)
{
	return strlen(s) < CHAIN_NAME_MAX && dirfd_plain_name(s);
}

static int get_u64(json_t *o, const char *key, uint64_t *out)
{
	json_t *v = json_object_get(o, key);
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return -EINVAL;
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

static int get_name(json_t *o, const char *key, char out[CHAIN_NAME_MAX])
{
	json_t *v = json_object_get(o, key);
	if (!json_is_string(v) || !plain_name(json_string_value(v)))
		return -EINVAL;
	snprintf(out, CHAIN_NAME_MAX, "%s", json_string_value(v));
	return 0;
}

const uint8_t *chain_digest_get(const struct chain *c, const char *name)
{
	for (int i = 0; i < c->nr_digests; i++)
		if (!strcmp(c->digests[i].name, name))
			return c->digests[i].sha256;
	return NULL;
}

int chain_digest_set(struct chain *c, const char *name, const uint8_t sha256[32])
{
	if (!plain_name(name))
		return -EINVAL;
	for (int i = 0; i < c->nr_digests; i++)
		if (!strcmp(c->digests[i].name, name)) {
			memcpy(c->digests[i].sha256, sha256, 32);
			return 0;
		}
	if (c->nr_digests >= CHAIN_MAX_DIGESTS)
		return -E2BIG;
	struct chain_digest *d = &c->digests[c->nr_digests++];
	snprintf(d->name, sizeof(d->name), "%s", name);
	memcpy(d->sha256, sha256, 32);
	return 0;
}

/* A memory layer or state file name of ours (mem-N, mem-N-cK, state-N). */
static bool layer_file_name(const char *n)
{
	const char *p = !strncmp(n, "mem-", 4) ? n + 4 : !strncmp(n, "state-", 6) ? n + 6 : NULL;
	if (!p || !isdigit((unsigned char)*p))
		return false;
	while (isdigit((unsigned char)*p))
		p++;
	if (n[0] == 'm' && p[0] == '-' && p[1] == 'c') {
		p += 2;
		while (isdigit((unsigned char)*p))
			p++;
	}
	return *p == 0;
}

static bool layer_lists(const struct chain *c, const char *name)
{
	for (int i = 0; i < c->nr_layers; i++)
		if (!strcmp(c->layers[i].mem, name) || !strcmp(c->layers[i].state, name))
			return true;
	return false;
}

void chain_digest_prune(struct chain *c)
{
	int k = 0;
	for (int i = 0; i < c->nr_digests; i++)
		if (!layer_file_name(c->digests[i].name) || layer_lists(c, c->digests[i].name))
			c->digests[k++] = c->digests[i];
	c->nr_digests = k;
}

/* Version 2's "sha256": {name: 64 lower-case hex digits}; every layer's files must be there. */
static int parse_digests(json_t *root, struct chain *c, char *err, size_t errlen)
{
	json_t *m = json_object_get(root, "sha256");
	if (!json_is_object(m))
		return errmsg(err, errlen, -EINVAL,
			      "chain file: sha256 is missing or not an object");
	if (json_object_size(m) > CHAIN_MAX_DIGESTS)
		return errmsg(err, errlen, -EINVAL, "chain file: more than %d digests",
			      CHAIN_MAX_DIGESTS);
	const char *k;
	json_t *v;
	json_object_foreach(m, k, v)
	{
		uint8_t d[32];
		if (!plain_name(k) || !json_is_string(v) || digest_unhex(json_string_value(v), d) ||
		    chain_digest_set(c, k, d))
			return errmsg(err, errlen, -EINVAL,
				      "chain file: a sha256 entry is malformed");
	}
	for (int i = 0; i < c->nr_layers; i++)
		if (!chain_digest_get(c, c->layers[i].mem) ||
		    !chain_digest_get(c, c->layers[i].state))
			return errmsg(err, errlen, -EINVAL,
				      "chain file: layer %d has no sha256 of its files", i);
	c->has_digests = true;
	return 0;
}

int chain_parse(const char *text, size_t len, struct chain *c, char *err, size_t errlen)
{
	json_error_t je;
	c->nr_digests = 0;
	c->has_digests = false;
	c->gen = 0;
	json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return errmsg(err, errlen, -EINVAL, "chain file is not valid JSON (line %d: %s)",
			      je.line, je.text);
	int r = -EINVAL;
	json_t *fmt = json_object_get(root, "format");
	json_t *layers = json_object_get(root, "layers");
	json_t *id = json_object_get(root, "chain_id");
	uint64_t version;
	if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "cove-chain") ||
	    get_u64(root, "version", &version)) {
		errmsg(err, errlen, -EINVAL, "chain file is not a cove chain file");
		goto out;
	}
	/* 1: before digests and generations (read, never written); 2: both. */
	if (version != 1 && version != 2) {
		errmsg(err, errlen, -EINVAL, "chain file version %llu is not supported",
		       (unsigned long long)version);
		goto out;
	}
	if (version == 2 &&
	    (get_u64(root, "generation", &c->gen) || c->gen == 0 || c->gen > CHAIN_GEN_MAX)) {
		errmsg(err, errlen, -EINVAL, "chain file: generation is missing or out of range");
		goto out;
	}
	if (!json_is_string(id) || unhex(json_string_value(id), c->chain_id) ||
	    get_u64(root, "ram_size", &c->ram_size) || !json_is_array(layers) || c->ram_size == 0 ||
	    c->ram_size % 4096 || c->ram_size > (1ULL << 40)) {
		errmsg(err, errlen, -EINVAL,
		       "chain file: chain_id, ram_size or layers is missing or bad");
		goto out;
	}
	if (json_array_size(layers) > CHAIN_MAX_LAYERS) {
		errmsg(err, errlen, -EINVAL, "chain file has more than %d layers",
		       CHAIN_MAX_LAYERS);
		goto out;
	}
	c->nr_layers = 0;
	size_t i;
	json_t *l;
	json_array_foreach(layers, i, l)
	{
		struct chain_layer *cl = &c->layers[c->nr_layers];
		memset(cl, 0, sizeof(*cl));
		json_t *full = json_object_get(l, "full");
		if (!json_is_object(l) || get_u64(l, "id", &cl->id) ||
		    get_u64(l, "parent", &cl->parent) || !json_is_boolean(full) ||
		    get_name(l, "mem", cl->mem) || get_name(l, "state", cl->state) ||
		    get_u64(l, "present", &cl->present) || get_u64(l, "stored", &cl->stored) ||
		    get_u64(l, "created_ns", &cl->created_ns)) {
			errmsg(err, errlen, -EINVAL, "chain file: layer %zu is malformed", i);
			goto out;
		}
		cl->full = json_is_true(full);
		if (cl->stored > cl->present) {
			errmsg(err, errlen, -EINVAL,
			       "chain file: layer %zu stores more pages than it holds", i);
			goto out;
		}
		/* Layer 0 is a full one; each later layer names the one before as its parent. */
		bool ok = c->nr_layers == 0
			      ? cl->full
			      : (!cl->full && cl->parent == c->layers[c->nr_layers - 1].id &&
				 cl->id > cl->parent);
		if (!ok || cl->id == 0) {
			errmsg(err, errlen, -EINVAL,
			       "chain file: layer %zu does not follow layer %zu", i, i ? i - 1 : 0);
			goto out;
		}
		c->nr_layers++;
	}
	if (version == 2 && parse_digests(root, c, err, errlen))
		goto out;
	r = 0;
out:
	json_decref(root);
	return r;
}

/* "chain.NNNNNNNNNN.json": 1 with its generation, else 0. */
static int gen_name(const char *n, uint64_t *gen)
{
	size_t pl = strlen(CHAIN_GEN_PREFIX), sl = strlen(CHAIN_GEN_SUFFIX);
	if (strlen(n) != pl + CHAIN_GEN_DIGITS + sl || strncmp(n, CHAIN_GEN_PREFIX, pl) ||
	    strcmp(n + pl + CHAIN_GEN_DIGITS, CHAIN_GEN_SUFFIX))
		return 0;
	uint64_t v = 0;
	for (int i = 0; i < CHAIN_GEN_DIGITS; i++) {
		if (!isdigit((unsigned char)n[pl + i]))
			return 0;
		v = v * 10 + (uint64_t)(n[pl + i] - '0');
	}
	*gen = v;
	return v > 0;
}

static void gen_file(uint64_t gen, char out[CHAIN_NAME_MAX])
{
	snprintf(out, CHAIN_NAME_MAX, "%s%0*llu%s", CHAIN_GEN_PREFIX, CHAIN_GEN_DIGITS,
		 (unsigned long long)gen, CHAIN_GEN_SUFFIX);
}

static int cmp_desc(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? 1 : x > y ? -1 : 0;
}

/*
 * The generation files in `dfd` (newest first) into gens[CHAIN_GEN_SCAN_MAX]: their count, or
 * -E2BIG past the cap, -errno.
 */
static int list_gens(int dfd, uint64_t *gens)
{
	int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -ENOMEM;
	}
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		uint64_t g;
		if (!gen_name(e->d_name, &g))
			continue;
		if (n == CHAIN_GEN_SCAN_MAX) {
			n = -E2BIG;
			break;
		}
		gens[n++] = g;
	}
	closedir(d);
	if (n > 0)
		qsort(gens, (size_t)n, sizeof(*gens), cmp_desc);
	return n;
}

/* Reads and parses one chain file beneath dfd; a generation file must say its own number. */
static int load_one(int dfd, const char *dir, const char *name, uint64_t want_gen, char *buf,
		    struct chain *c, char *err, size_t errlen)
{
	int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		return errmsg(err, errlen, -e, "cannot open %s/%s: %s", dir, name, strerror(e));
	}
	struct stat st;
	int r = fstat(fd, &st) < 0 ? -errno : S_ISREG(st.st_mode) ? 0 : -EINVAL;
	ssize_t n = r ? r : read_upto(fd, buf, CHAIN_MAX_BYTES + 1);
	close(fd);
	if (n < 0)
		return errmsg(err, errlen, (int)n, "cannot read %s/%s: %s", dir, name,
			      strerror((int)-n));
	if ((size_t)n > CHAIN_MAX_BYTES)
		return errmsg(err, errlen, -EFBIG, "%s/%s is larger than %u bytes", dir, name,
			      CHAIN_MAX_BYTES);
	char e2[400];
	r = chain_parse(buf, (size_t)n, c, e2, sizeof(e2));
	if (!r && want_gen && c->gen != want_gen)
		r = errmsg(e2, sizeof(e2), -EINVAL, "it says generation %llu",
			   (unsigned long long)c->gen);
	if (r)
		return errmsg(err, errlen, r, "%s/%s: %s", dir, name, e2);
	snprintf(c->source, sizeof(c->source), "%s", name);
	return 0;
}

/* chain_load beneath an open directory. */
static int load_at(int dfd, struct chain *c, char *err, size_t errlen)
{
	const char *dir = c->dir;
	uint64_t *gens = malloc(CHAIN_GEN_SCAN_MAX * sizeof(*gens));
	char *buf = malloc(CHAIN_MAX_BYTES + 1);
	struct chain *base = malloc(sizeof(*base));
	int r = -ENOMEM;
	if (!gens || !buf || !base)
		goto out;
	int n = list_gens(dfd, gens);
	if (n < 0) {
		r = errmsg(err, errlen, n,
			   n == -E2BIG ? "%s holds more than %d chain generation files (%s)"
				       : "cannot list %s: %d %s",
			   dir, CHAIN_GEN_SCAN_MAX, strerror(-n));
		goto out;
	}
	/* chain.json (settled, or a chain from before generations) and the generation it is. */
	char jerr[512] = "";
	memset(base, 0, sizeof(*base));
	memcpy(base->dir, c->dir, sizeof(c->dir));
	int jr = load_one(dfd, dir, CHAIN_FILE, 0, buf, base, jerr, sizeof(jerr));
	uint64_t jgen = jr ? 0 : base->gen;
	int skipped = 0, first_r = 0;
	char first_bad[512] = "";
	bool found = false;
	if (jr && jr != -ENOENT) {
		skipped = 1;
		first_r = jr;
		snprintf(first_bad, sizeof(first_bad), "%s", jerr);
	}
	/* Newest first: generations above chain.json's, then chain.json, then older ones. */
	for (int pass = 0; pass < 2 && !found; pass++) {
		for (int i = 0; i < n && !found && skipped < CHAIN_GEN_TRY_MAX; i++) {
			/* A generation file wins over chain.json holding the same generation. */
			if (pass == 0 ? gens[i] < jgen : gens[i] >= jgen)
				continue;
			char name[CHAIN_NAME_MAX];
			gen_file(gens[i], name);
			int lr = load_one(dfd, dir, name, gens[i], buf, c, err, errlen);
			found = lr == 0;
			if (lr && !skipped++) {
				snprintf(first_bad, sizeof(first_bad), "%s", err);
				first_r = lr;
			}
		}
		/* Past the cap a valid newer generation may be out of reach: no silent rollback. */
		if (skipped >= CHAIN_GEN_TRY_MAX)
			break;
		if (pass == 0 && !found && !jr) {
			memcpy(c, base, sizeof(*c));
			found = true;
		}
	}
	r = found ? 0 : -EINVAL;
	if (r && !skipped)
		r = errmsg(err, errlen, jr, "%s", jerr); /* no chain.json and no generation */
	else if (r && skipped == 1)
		r = errmsg(err, errlen, first_r, "%s", first_bad); /* the one file there is */
	else if (r)
		r = errmsg(err, errlen, -EINVAL, "no valid chain generation in %s (newest: %s)",
			   dir, first_bad);
	else if (skipped)
		errmsg(c->warning, sizeof(c->warning), 0,
		       "skipped %d chain file(s) that do not validate, using %s: %s", skipped,
		       c->source, first_bad);
out:
	free(base);
	free(buf);
	free(gens);
	return r;
}

int chain_load(const char *dir, struct chain *c, char *err, size_t errlen)
{
	memset(c, 0, sizeof(*c));
	if (snprintf(c->dir, sizeof(c->dir), "%s", dir) >= (int)sizeof(c->dir))
		return errmsg(err, errlen, -ENAMETOOLONG, "chain directory name is too long");
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		int e = errno;
		return errmsg(err, errlen, -e, "cannot open %s/%s: %s", dir, CHAIN_FILE,
			      strerror(e));
	}
	int r = load_at(dfd, c, err, errlen);
	close(dfd);
	return r;
}

const struct chain_layer *chain_latest(const struct chain *c)
{
	return c->nr_layers ? &c->layers[c->nr_layers - 1] : NULL;
}

static char *chain_text(const struct chain *c, uint64_t gen)
{
	char hex[33];
	chain_id_hex(c->chain_id, hex);
	json_t *layers = json_array();
	for (int i = 0; i < c->nr_layers; i++) {
		const struct chain_layer *l = &c->layers[i];
		json_array_append_new(
		    layers,
		    json_pack("{s:I,s:I,s:b,s:s,s:s,s:I,s:I,s:I}", "id", (json_int_t)l->id,
			      "parent", (json_int_t)l->parent, "full", l->full, "mem", l->mem,
			      "state", l->state, "present", (json_int_t)l->present, "stored",
			      (json_int_t)l->stored, "created_ns", (json_int_t)l->created_ns));
	}
	json_t *dg = json_object();
	for (int i = 0; dg && i < c->nr_digests; i++) {
		char h[DIGEST_HEX_LEN];
		digest_hex(c->digests[i].sha256, h);
		json_object_set_new(dg, c->digests[i].name, json_string(h));
	}
	json_t *root = json_pack("{s:s,s:i,s:I,s:s,s:I,s:o,s:o}", "format", "cove-chain", "version",
				 2, "generation", (json_int_t)gen, "chain_id", hex, "ram_size",
				 (json_int_t)c->ram_size, "layers", layers, "sha256", dg);
	char *text = root ? json_dumps(root, JSON_INDENT(1) | JSON_SORT_KEYS) : NULL;
	json_decref(root);
	return text;
}

/* Writes `text` to a fresh temporary file beneath dfd and renames it to `name` (as `replace`). */
static int write_named(int dfd, const char *dir, const char *name, const char *text, bool replace,
		       char *err, size_t errlen)
{
	char tmp[CHAIN_NAME_MAX + 32];
	int fd = dirfd_create_tmp(dfd, name, tmp, sizeof(tmp), O_WRONLY, 0600);
	if (fd < 0)
		return errmsg(err, errlen, fd, "cannot create a temporary file for %s/%s: %s", dir,
			      name, strerror(-fd));
	int r = pwrite_full(fd, text, strlen(text), 0);
	if (r)
		errmsg(err, errlen, r, "writing %s/%s: %s", dir, tmp, strerror(-r));
	if (!r && fsync(fd) < 0)
		r = errmsg(err, errlen, -errno, "fsync %s/%s: %s", dir, tmp, strerror(errno));
	close(fd);
	if (!r) {
		r = replace ? dirfd_rename(dfd, tmp, name) : dirfd_rename_noreplace(dfd, tmp, name);
		if (r && r != -EEXIST)
			errmsg(err, errlen, r, "rename to %s/%s: %s", dir, name, strerror(-r));
	}
	if (r)
		(void)dirfd_unlink(dfd,
				   tmp); /* best effort: EPERM in the jail, settle removes it */
	else
		(void)dirfd_sync(dfd);
	return r;
}

int chain_commit(struct chain *c, char *err, size_t errlen)
{
	int dfd = dirfd_open_dir(c->dir, false, err, errlen);
	if (dfd < 0)
		return dfd;
	uint64_t *gens = malloc(CHAIN_GEN_SCAN_MAX * sizeof(*gens));
	int r = gens ? 0 : -ENOMEM;
	chain_digest_prune(c);
	/* Every layer's files get a digest: those the caller did not give are read here. */
	for (int i = 0; !r && i < 2 * c->nr_layers; i++) {
		const char *name = i % 2 ? c->layers[i / 2].state : c->layers[i / 2].mem;
		uint8_t d[DIGEST_LEN];
		if (chain_digest_get(c, name))
			continue;
		r = digest_file_at(dfd, name, d);
		if (!r)
			r = chain_digest_set(c, name, d);
		if (r)
			errmsg(err, errlen, r, "cannot digest %s/%s: %s", c->dir, name,
			       strerror(-r));
	}
	if (!r)
		c->has_digests = true;
	/*
	 * Past chain.json's generation too (a settled chain; a Full snapshot's new chain starts
	 * with gen 0): a lower number would lose to it at the next load.
	 */
	uint64_t floor = c->gen;
	char *jbuf = r ? NULL : malloc(CHAIN_MAX_BYTES + 1);
	struct chain *jc = r ? NULL : malloc(sizeof(*jc));
	if (!r && (!jbuf || !jc))
		r = -ENOMEM;
	if (!r) {
		char e2[8];
		memset(jc, 0, sizeof(*jc));
		if (load_one(dfd, c->dir, CHAIN_FILE, 0, jbuf, jc, e2, sizeof(e2)) == 0 &&
		    jc->gen > floor)
			floor = jc->gen;
	}
	free(jbuf);
	free(jc);
	/* A name another writer took (EEXIST) moves on to the next generation, a few times. */
	for (int attempt = 0; !r && attempt < 4; attempt++) {
		int n = list_gens(dfd, gens);
		if (n < 0) {
			r = errmsg(err, errlen, n, "cannot list the generations of %s: %s", c->dir,
				   strerror(-n));
			break;
		}
		uint64_t gen = n && gens[0] > floor ? gens[0] : floor;
		if (++gen > CHAIN_GEN_MAX) {
			r = errmsg(err, errlen, -ERANGE, "%s: chain generations exhausted", c->dir);
			break;
		}
		char *text = chain_text(c, gen);
		if (!text) {
			r = -ENOMEM;
			break;
		}
		/* A new chain's first generation is chain.json itself (created, not replaced). */
		char name[CHAIN_NAME_MAX];
		struct stat st;
		if (n == 0 && fstatat(dfd, CHAIN_FILE, &st, AT_SYMLINK_NOFOLLOW) < 0 &&
		    errno == ENOENT)
			snprintf(name, sizeof(name), "%s", CHAIN_FILE);
		else
			gen_file(gen, name);
		r = write_named(dfd, c->dir, name, text, false, err, errlen);
		if (!r && strcmp(name, CHAIN_FILE) && !c->no_replace) {
			/*
			 * Committed. chain.json follows, best effort, where replacing is allowed,
			 * for what still reads it by name; the jail refuses (EPERM), and after the
			 * first refusal this chain stops trying: chain_settle writes it on the host
			 * side.
			 */
			char e2[8];
			int jr = write_named(dfd, c->dir, CHAIN_FILE, text, true, e2, sizeof(e2));
			c->no_replace = jr == -EPERM || jr == -EACCES;
		}
		free(text);
		if (!r) {
			c->gen = gen;
			break;
		}
		if (r != -EEXIST)
			break;
		errmsg(err, errlen, r, "%s: chain generation %llu exists already", c->dir,
		       (unsigned long long)gen);
		floor = gen;
		if (attempt < 3)
			r = 0;
	}
	free(gens);
	close(dfd);
	return r;
}

/* A temporary file of ours: ".mem-...", ".state-..." or ".chain...", ending in ".tmp". */
static bool tmp_name(const char *n)
{
	size_t len = strlen(n);
	if (n[0] != '.' || len < 6 || strcmp(n + len - 4, ".tmp"))
		return false;
	if (strncmp(n + 1, "mem-", 4) && strncmp(n + 1, "state-", 6) && strncmp(n + 1, "chain.", 6))
		return false;
	for (size_t i = 1; i < len; i++)
		if (!isalnum((unsigned char)n[i]) && n[i] != '.' && n[i] != '-' && n[i] != '_')
			return false;
	return true;
}

int chain_settle(const char *dir, char *err, size_t errlen)
{
	int dfd = dirfd_open_dir(dir, false, err, errlen);
	if (dfd < 0)
		return dfd;
	struct chain *c = malloc(sizeof(*c));
	int r = -ENOMEM;
	if (!c)
		goto out;
	memset(c, 0, sizeof(*c));
	snprintf(c->dir, sizeof(c->dir), "%s", dir);
	r = load_at(dfd, c, err, errlen);
	bool have = r == 0;
	if (r == -ENOENT)
		r = 0; /* no chain: only leftovers to remove */
	if (r)
		goto out; /* nothing valid: remove nothing */
	/* An encrypted chain's layer id counter, moved by create-only steps in the jail. */
	r = keyfile_settle_layer_seq(dir, err, errlen);
	if (r)
		goto out;
	if (have && strcmp(c->source, CHAIN_FILE)) {
		char *text = chain_text(c, c->gen);
		r = text ? write_named(dfd, dir, CHAIN_FILE, text, true, err, errlen) : -ENOMEM;
		free(text);
		if (r)
			goto out;
	}
	int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd < 0 ? NULL : fdopendir(fd);
	if (!d) {
		if (fd >= 0)
			close(fd);
		r = errmsg(err, errlen, -errno, "cannot list %s: %s", dir, strerror(errno));
		goto out;
	}
	struct dirent *e;
	while ((e = readdir(d))) {
		uint64_t g;
		const char *n = e->d_name;
		bool ours = tmp_name(n) || gen_name(n, &g) ||
			    (have && layer_file_name(n) && !layer_lists(c, n));
		struct stat st;
		if (!ours || fstatat(dfd, n, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
			continue;
		(void)unlinkat(dfd, n, 0);
	}
	closedir(d);
	(void)dirfd_sync(dfd);
out:
	free(c);
	close(dfd);
	return r;
}

/* One line of a stamp file: a file as it was when its digest was last checked. */
struct stamp {
	char name[CHAIN_NAME_MAX];
	unsigned long long dev, ino, size, cs, cn, ms, mn;
	char hex[DIGEST_HEX_LEN];
};

static void stamp_of(struct stamp *t, const char *name, const struct stat *st, const char *hex)
{
	memset(t, 0, sizeof(*t));
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->dev = (unsigned long long)st->st_dev;
	t->ino = (unsigned long long)st->st_ino;
	t->size = (unsigned long long)st->st_size;
	t->cs = (unsigned long long)st->st_ctim.tv_sec;
	t->cn = (unsigned long long)st->st_ctim.tv_nsec;
	t->ms = (unsigned long long)st->st_mtim.tv_sec;
	t->mn = (unsigned long long)st->st_mtim.tv_nsec;
	snprintf(t->hex, sizeof(t->hex), "%s", hex);
}

/*
 * old stamps cur: equal, or equal but for the ctime when old is frozen (its ctime 0 0:
 * chain_stamps_freeze, a template's file that no process can hold open for writing any more,
 * whose ctime each hard link to it changes).
 */
static bool stamp_match(const struct stamp *old, const struct stamp *cur)
{
	struct stamp c = *cur;

	if (old->cs == 0 && old->cn == 0)
		c.cs = c.cn = 0;
	return !memcmp(old, &c, sizeof(c));
}

/* The stamp file (untrusted format, capped): entries into t[CHAIN_MAX_DIGESTS], their count. */
static int read_stamps(const char *path, struct stamp *t)
{
	FILE *f = path ? fopen(path, "re") : NULL;
	if (!f)
		return 0;
	int n = 0;
	char line[512];
	while (n < CHAIN_MAX_DIGESTS && fgets(line, sizeof(line), f)) {
		struct stamp *s = &t[n];
		char name[256], hex[80];
		if (sscanf(line, "%255s %llu %llu %llu %llu %llu %llu %llu %79s", name, &s->dev,
			   &s->ino, &s->size, &s->cs, &s->cn, &s->ms, &s->mn, hex) != 9 ||
		    !plain_name(name) || strlen(hex) != 64)
			continue;
		memcpy(s->name, name, strlen(name) + 1); /* plain_name: shorter than the field */
		memcpy(s->hex, hex, sizeof(s->hex));	 /* 64 digits and the NUL */
		n++;
	}
	fclose(f);
	return n;
}

int chain_stamped_digest(const char *stamps, const char *name, const struct stat *st,
			 uint8_t out[DIGEST_LEN])
{
	struct stamp *t = calloc(CHAIN_MAX_DIGESTS, sizeof(*t));
	if (!t)
		return -ENOMEM;
	int n = read_stamps(stamps, t), r = -ENOENT;
	for (int i = 0; i < n && r; i++) {
		struct stamp cur;
		stamp_of(&cur, name, st, t[i].hex);
		if (stamp_match(&t[i], &cur))
			r = digest_unhex(t[i].hex, out);
	}
	free(t);
	return r;
}

static int write_stamps(const char *path, const struct stamp *t, int n)
{
	char tmp[4200];
	if (snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, (int)getpid()) >= (int)sizeof(tmp))
		return -ENAMETOOLONG;
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	FILE *f = fdopen(fd, "w");
	if (!f) {
		close(fd);
		unlink(tmp);
		return -ENOMEM;
	}
	for (int i = 0; i < n; i++)
		fprintf(f, "%s %llu %llu %llu %llu %llu %llu %llu %s\n", t[i].name, t[i].dev,
			t[i].ino, t[i].size, t[i].cs, t[i].cn, t[i].ms, t[i].mn, t[i].hex);
	int r = fflush(f) || fsync(fd) ? -errno : 0;
	if (fclose(f) && !r)
		r = -EIO;
	if (!r && rename(tmp, path) < 0)
		r = -errno;
	if (r)
		unlink(tmp);
	return r;
}

int chain_stamps_freeze(const char *stamps)
{
	struct stamp *t = calloc(CHAIN_MAX_DIGESTS, sizeof(*t));
	int n, r;

	if (!t)
		return -ENOMEM;
	n = read_stamps(stamps, t);
	for (int i = 0; i < n; i++)
		t[i].cs = t[i].cn = 0;
	r = write_stamps(stamps, t, n);
	free(t);
	return r;
}

int chain_verify_stamped(const char *dir, const char *stamps, char *err, size_t errlen)
{
	return chain_verify_stamped_skip(dir, stamps, NULL, 0, err, errlen);
}

static bool skipped(const struct chain_skip *skip, int nskip, const struct chain_digest *d)
{
	for (int i = 0; i < nskip; i++)
		if (!strcmp(skip[i].name, d->name) &&
		    !memcmp(skip[i].sha256, d->sha256, DIGEST_LEN))
			return true;
	return false;
}

int chain_verify_stamped_skip(const char *dir, const char *stamps, const struct chain_skip *skip,
			      int nskip, char *err, size_t errlen)
{
	struct chain *c = malloc(sizeof(*c));
	struct stamp *old = calloc(CHAIN_MAX_DIGESTS, sizeof(*old));
	struct stamp *now = calloc(CHAIN_MAX_DIGESTS, sizeof(*now));
	int dfd = -1, r = -ENOMEM, nnow = 0;
	if (!c || !old || !now)
		goto out;
	r = chain_load(dir, c, err, errlen);
	if (r)
		goto out;
	if (!c->has_digests) {
		r = 1;
		goto out;
	}
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		r = errmsg(err, errlen, -errno, "%s: %s", dir, strerror(errno));
		goto out;
	}
	int nold = read_stamps(stamps, old);
	struct timespec ts; /* before any file is read */
	clock_gettime(CLOCK_REALTIME, &ts);
	for (int i = 0; i < c->nr_digests; i++) {
		const struct chain_digest *d = &c->digests[i];
		char hex[DIGEST_HEX_LEN];
		digest_hex(d->sha256, hex);
		int fd = dirfd_open(dfd, d->name, O_RDONLY);
		struct stat st;
		if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
			r = errmsg(err, errlen, fd < 0 ? fd : -EINVAL, "%s: %s: %s", dir, d->name,
				   fd == -ELOOP ? "a link where a chain file should be, refused"
				   : fd < 0	? strerror(-fd)
						: "not a regular file");
			if (fd >= 0)
				close(fd);
			goto out;
		}
		if (skipped(skip, nskip, d)) { /* checked chunk by chunk as it arrives */
			close(fd);
			continue;
		}
		struct stamp cur;
		stamp_of(&cur, d->name, &st, hex);
		bool fresh = false, frozen = false;
		for (int k = 0; k < nold && !fresh; k++)
			if ((fresh = stamp_match(&old[k], &cur)))
				frozen = old[k].cs == 0 && old[k].cn == 0;
		if (frozen) { /* stays frozen: the same file as when it was frozen */
			now[nnow] = cur;
			now[nnow].cs = now[nnow].cn = 0;
			nnow++;
			close(fd);
			continue;
		}
		if (!fresh) {
			uint8_t got[DIGEST_LEN];
			r = digest_fd(fd, got);
			if (!r && memcmp(got, d->sha256, DIGEST_LEN))
				r = errmsg(
				    err, errlen, -EBADMSG,
				    "%s: %s: SHA-256 does not match the chain (the file changed "
				    "after its commit)",
				    dir, d->name);
			else if (r)
				errmsg(err, errlen, r, "%s: %s: %s", dir, d->name, strerror(-r));
		}
		close(fd);
		if (r)
			goto out;
		/*
		 * File times come from a coarse clock (a jiffy): a write within the granule of the
		 * last change would keep this ctime. Changed in the 100 ms before this check began:
		 * not stamped, read again next time.
		 */
		int64_t age_ns = ((int64_t)ts.tv_sec - (int64_t)st.st_ctim.tv_sec) * 1000000000LL +
				 ((int64_t)ts.tv_nsec - (int64_t)st.st_ctim.tv_nsec);
		if (age_ns > 100000000LL)
			now[nnow++] = cur;
	}
	r = 0;
	if (stamps && (r = write_stamps(stamps, now, nnow)))
		errmsg(err, errlen, r, "cannot write %s: %s", stamps, strerror(-r));
out:
	if (dfd >= 0)
		close(dfd);
	free(now);
	free(old);
	free(c);
	return r;
}
