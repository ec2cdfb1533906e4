/* Generations up to the store and back (sync.h). */
#include "lifecycle/store/sync.h"
#include "lifecycle/store/lazy_blob.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "lifecycle/name.h"
#include "lifecycle/template.h"
#include "lifecycle/store/stage.h"
#include "lifecycle/store_stats.h"
#include "snapshot/chain.h"

#define GEN_DIGITS 20

bool store_image_name(const char *n)
{
	if (!strcmp(n, "kernel") || !strcmp(n, "initrd") || !strcmp(n, STORE_IMAGE_JSON))
		return true;
	unsigned d;
	char tail[8];
	return sscanf(n, "disk%u-bas%1s", &d, tail) == 2 && d < SBX_MAX_DISKS &&
	       !strcmp(n + strlen(n) - 5, "-base") && strlen(n) == (d > 9 ? 11u : 10u);
}

static void blob_key(const uint8_t d[DIGEST_LEN], char *key, size_t cap)
{
	char hex[DIGEST_HEX_LEN];
	digest_hex(d, hex);
	snprintf(key, cap, STORE_BLOB_PREFIX "%s", hex);
}

void store_blob_key(const uint8_t d[DIGEST_LEN], char *key, size_t cap)
{
	blob_key(d, key, cap);
}

void store_chunks_key(const uint8_t d[DIGEST_LEN], char *key, size_t cap)
{
	char hex[DIGEST_HEX_LEN];
	digest_hex(d, hex);
	snprintf(key, cap, STORE_CHUNKS_PREFIX "%s", hex);
}

bool store_lazy_name(const char *name)
{
	return !strncmp(name, "mem-", 4);
}

int store_name_dir(const char *name, char *dir, size_t cap, char *err, size_t errlen)
{
	bool tpl = name[0] == STORE_TPL_MARK;
	int r = tpl ? tpl_name_check(name + 1, err, errlen) : sbx_name_check(name, err, errlen);
	if (r)
		return r;
	int n = snprintf(dir, cap, "%s%s/", tpl ? STORE_TPL_PREFIX : STORE_SBX_PREFIX, name + tpl);
	return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

static int gen_key(const char *name, uint64_t gen, char *key, size_t cap)
{
	char dir[S3_KEY_MAX];
	int r = store_name_dir(name, dir, sizeof(dir), NULL, 0);
	if (r)
		return r;
	int n = snprintf(key, cap, "%sgen/%0*llu.json", dir, GEN_DIGITS, (unsigned long long)gen);
	return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

/* The generation a key under sandboxes/NAME/gen/ names, or 0. */
static uint64_t gen_of(const char *key, const char *dir)
{
	size_t dl = strlen(dir);
	if (strncmp(key, dir, dl) || strlen(key) != dl + GEN_DIGITS + 5 ||
	    strcmp(key + dl + GEN_DIGITS, ".json"))
		return 0;
	uint64_t g = 0;
	for (size_t i = dl; i < dl + GEN_DIGITS; i++) {
		if (key[i] < '0' || key[i] > '9' || g > (UINT64_MAX - 9) / 10)
			return 0;
		g = g * 10 + (uint64_t)(key[i] - '0');
	}
	return g;
}

int store_newest_generation(struct s3_client *c, const char *name, uint64_t *gen, char *err,
			    size_t errlen)
{
	char dir[S3_KEY_MAX + 8], tomb[S3_KEY_MAX + 16], base[S3_KEY_MAX];
	int r = store_name_dir(name, base, sizeof(base), err, errlen);
	if (r)
		return r;
	snprintf(dir, sizeof(dir), "%sgen/", base);
	snprintf(tomb, sizeof(tomb), "%s" STORE_TOMBSTONE, base);
	struct s3_object_info info;
	r = s3_head(c, tomb, &info, err, errlen);
	if (!r)
		return errmsg(err, errlen, -EIDRM,
			      "sandbox %s was removed (its tombstone is in the "
			      "store)",
			      name);
	if (r != -ENOENT)
		return r;
	*gen = 0;
	char token[S3_KEY_MAX + 1] = "";
	/* Keys list in order, and the generation's 20 digits sort as numbers: the last page's
	 * last key is the newest. Listing all of them is bounded by retention (K kept). */
	for (int pages = 0; pages < 1000; pages++) {
		struct s3_list_page pg;
		r = s3_list(c, dir, token, S3_LIST_MAX, &pg, err, errlen);
		if (r)
			return r;
		for (size_t i = 0; i < pg.n; i++) {
			uint64_t g = gen_of(pg.entries[i].key, dir);
			if (g > *gen)
				*gen = g;
		}
		bool more = pg.truncated && pg.next_token[0];
		snprintf(token, sizeof(token), "%s", pg.next_token);
		s3_list_page_free(&pg);
		if (!more)
			return 0;
	}
	return errmsg(err, errlen, -E2BIG, "sandbox %s: too many generations to list", name);
}

/* Sends one packed blob unless the store has it. */
static int send_blob(struct s3_client *c, const struct store_file *f, int fd, uint64_t len,
		     struct store_sync_stats *st, char *err, size_t errlen)
{
	char key[S3_KEY_MAX];
	blob_key(f->digest, key, sizeof(key));
	struct s3_object_info info;
	int r = s3_head(c, key, &info, err, errlen);
	/* Any blob under this name holds the same file (another host may have packed its holes
	 * differently: a fetched copy's extents need not be the writer's); a fetch checks it. */
	if (!r) {
		st->blobs_present++;
		return 0;
	}
	if (r && r != -ENOENT)
		return r;
	/* A blob is named by what it holds: one already there (412) holds the same bytes. */
	if (len <= STORE_SINGLE_PUT_MAX)
		r = s3_put_fd(c, key, fd, 0, len, S3_IF_NONE_MATCH, err, errlen);
	else
		r = s3_upload_fd(c, key, fd, 0, len, NULL, err, errlen);
	if (r == -EEXIST) {
		st->blobs_present++;
		return 0;
	}
	if (r)
		return r;
	st->blobs_sent++;
	st->bytes_sent += len;
	return 0;
}

void store_upload_cache_free(struct store_upload_cache *c)
{
	free(c->e);
	memset(c, 0, sizeof(*c));
}

static struct store_upload_cached *cache_find(struct store_upload_cache *c, const char *as)
{
	for (size_t i = 0; c && i < c->n; i++)
		if (!strcmp(c->e[i].name, as))
			return &c->e[i];
	return NULL;
}

static bool cache_same(const struct store_upload_cached *e, const struct stat *st)
{
	return e->dev == (unsigned long long)st->st_dev &&
	       e->ino == (unsigned long long)st->st_ino &&
	       e->size == (unsigned long long)st->st_size &&
	       e->mtime_ns == (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec &&
	       e->ctime_ns == (long long)st->st_ctim.tv_sec * 1000000000LL + st->st_ctim.tv_nsec;
}

static void cache_put(struct store_upload_cache *c, const char *as, const struct stat *st,
		      const struct store_file *f)
{
	struct store_upload_cached *e = cache_find(c, as);
	if (!e) {
		if (c->n == c->cap) {
			size_t cap = c->cap ? 2 * c->cap : 64;
			struct store_upload_cached *m = realloc(c->e, cap * sizeof(*m));
			if (!m)
				return; /* a cache: not having it only costs a hash */
			c->e = m;
			c->cap = cap;
		}
		e = &c->e[c->n++];
	}
	snprintf(e->name, sizeof(e->name), "%s", as);
	e->dev = (unsigned long long)st->st_dev;
	e->ino = (unsigned long long)st->st_ino;
	e->size = (unsigned long long)st->st_size;
	e->mtime_ns = (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
	e->ctime_ns = (long long)st->st_ctim.tv_sec * 1000000000LL + st->st_ctim.tv_nsec;
	e->f = *f;
}

static int stage_and_send(struct s3_client *c, int in, const char *as, const uint8_t *recorded,
			  const struct store_upload_src *src, struct store_file *f,
			  struct store_sync_stats *st, char *err, size_t errlen)
{
	struct stat sb;
	/* Still arriving from the store here: it has them, under the digest they were fetched by.
	 */
	for (size_t i = 0; i < src->nr_lazy; i++)
		if (!strcmp(src->lazy[i].name, as) &&
		    (!recorded || !memcmp(recorded, src->lazy[i].digest, DIGEST_LEN))) {
			*f = src->lazy[i];
			st->blobs_present++;
			return 0;
		}
	/* Checked by the host at its last start, unchanged since, and in the store: not read. */
	uint8_t stamped[DIGEST_LEN];
	char key[S3_KEY_MAX];
	struct s3_object_info oi;
	if (src->stamps && recorded && fstat(in, &sb) == 0 &&
	    chain_stamped_digest(src->stamps, as, &sb, stamped) == 0 &&
	    !memcmp(stamped, recorded, DIGEST_LEN)) {
		blob_key(recorded, key, sizeof(key));
		if (s3_head(c, key, &oi, err, errlen) == 0) {
			memset(f, 0, sizeof(*f));
			snprintf(f->name, sizeof(f->name), "%s", as);
			f->size = (uint64_t)sb.st_size;
			memcpy(f->digest, recorded, DIGEST_LEN);
			st->blobs_present++;
			return 0;
		}
	}
	bool have = src->cache && fstat(in, &sb) == 0;
	struct store_upload_cached *e = have ? cache_find(src->cache, as) : NULL;
	if (e && cache_same(e, &sb) && (!recorded || !memcmp(recorded, e->f.digest, DIGEST_LEN))) {
		*f = e->f;
		st->blobs_present++;
		return 0;
	}
	int fd = -1;
	uint64_t len = 0;
	uint8_t *chunks = NULL;
	bool lazy = store_lazy_name(as);
	int r = store_stage_fd(in, as, recorded, src->stage_dfd, f, &fd, &len,
			       lazy ? &chunks : NULL, err, errlen);
	if (!r) {
		r = send_blob(c, f, fd, len, st, err, errlen);
		close(fd);
	}
	/* A memory layer's chunk digests: a host restoring it lazily checks each chunk alone. */
	if (!r && lazy) {
		store_chunks_key(f->digest, key, sizeof(key));
		r = s3_put(c, key, chunks, digest_chunks_of(f->size) * DIGEST_LEN, S3_IF_NONE_MATCH,
			   err, errlen);
		if (r == -EEXIST)
			r = 0;
	}
	free(chunks);
	if (!r && have)
		cache_put(src->cache, as, &sb, f);
	return r;
}

/* The host's images for the manifest: kernel, initrd, and the base of every overlay or
 * read-only disk (a writable disk without an overlay has no consistent copy to store). */
static int send_images(struct s3_client *c, const struct store_upload_src *src,
		       struct store_file *files, size_t *n, struct store_sync_stats *st, char *err,
		       size_t errlen)
{
	const struct sbx_spec *sp = src->spec;
	const char *paths[3 + SBX_MAX_DISKS];
	char names[3 + SBX_MAX_DISKS][STORE_FILE_NAME_MAX];
	int k = 0;
	paths[k] = sp->kernel;
	snprintf(names[k++], STORE_FILE_NAME_MAX, "kernel");
	if (sp->initrd[0]) {
		paths[k] = sp->initrd;
		snprintf(names[k++], STORE_FILE_NAME_MAX, "initrd");
	}
	for (int i = 0; i < sp->nr_disks; i++) {
		if (!sp->disks[i].overlay && !sp->disks[i].read_only)
			return errmsg(err, errlen, -EINVAL,
				      "disk %d is writable without an overlay: the store cannot "
				      "hold a consistent copy of it",
				      i);
		paths[k] = sp->disks[i].path;
		snprintf(names[k++], STORE_FILE_NAME_MAX, "disk%d-base", i);
	}
	/* An image's record (exec's defaults) goes with its root, when the sandbox has one. */
	if (src->image_json && access(src->image_json, F_OK) == 0) {
		paths[k] = src->image_json;
		snprintf(names[k++], STORE_FILE_NAME_MAX, STORE_IMAGE_JSON);
	}
	for (int i = 0; i < k; i++) {
		int in = open(paths[i], O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
		if (in < 0)
			return errmsg(err, errlen, -errno, "%s: %s", paths[i], strerror(errno));
		int r = stage_and_send(c, in, names[i], NULL, src, &files[*n], st, err, errlen);
		close(in);
		if (r)
			return r;
		(*n)++;
	}
	return 0;
}

int store_upload_generation(struct s3_client *c, const struct store_upload_src *src,
			    const struct store_keyring *kr, struct store_sync_stats *st, char *err,
			    size_t errlen)
{
	memset(st, 0, sizeof(*st));
	char(*names)[STORE_FILE_NAME_MAX] = calloc(STORE_STAGE_MAX_FILES, sizeof(*names));
	struct store_file *files =
	    calloc(STORE_STAGE_MAX_FILES + 3 + SBX_MAX_DISKS, sizeof(*files));
	struct chain *ch = calloc(1, sizeof(*ch));
	struct store_manifest m = {0};
	char *text = NULL;
	size_t n = 0, nf = 0;
	int r = names && files && ch ? 0 : errmsg(err, errlen, -ENOMEM, "out of memory");
	int cdfd = -1;
	if (!r)
		r = store_stage_list(src->chain_dir, names, STORE_STAGE_MAX_FILES, &n, &m.layer,
				     err, errlen);
	if (!r)
		r = chain_load(src->chain_dir, ch, err, errlen);
	if (!r && (cdfd = open(src->chain_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		r = errmsg(err, errlen, -errno, "%s: %s", src->chain_dir, strerror(errno));
	uint64_t newest = src->base;
	if (!r && !src->fenced)
		r = store_newest_generation(c, src->name, &newest, err, errlen);
	/* Layers first, the generation file last: nothing names a blob not yet there. */
	for (size_t i = 0; !r && i < n; i++) {
		int in = dirfd_open(cdfd, names[i], O_RDONLY);
		if (in < 0) {
			r = errmsg(err, errlen, in, "%s: %s", names[i], strerror(-in));
			break;
		}
		r = stage_and_send(c, in, names[i], chain_digest_get(ch, names[i]), src, &files[nf],
				   st, err, errlen);
		close(in);
		nf += !r;
	}
	if (!r)
		r = send_images(c, src, files, &nf, st, err, errlen);
	if (!r) {
		const struct sbx_spec *sp = src->spec;
		snprintf(m.sandbox, sizeof(m.sandbox), "%s", src->name);
		m.generation = newest + 1;
		m.lease = src->lease;
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		m.created_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
		m.mem_bytes = sp->mem_bytes;
		m.vcpus = sp->vcpus;
		snprintf(m.cmdline, sizeof(m.cmdline), "%s", sp->cmdline);
		m.nr_disks = sp->nr_disks;
		for (int i = 0; i < sp->nr_disks; i++)
			m.disks[i] = (struct store_disk){.read_only = sp->disks[i].read_only,
							 .overlay = sp->disks[i].overlay};
		m.vsock_rate = sp->vsock_rate;
		m.snapshot_every_ms = sp->snapshot_every_ms;
		m.idle_stop_ms = sp->idle_stop_ms;
		snprintf(m.key_type, sizeof(m.key_type), "%s", src->key_type ? src->key_type : "");
		snprintf(m.policy_id, sizeof(m.policy_id), "%s",
			 src->policy_id ? src->policy_id : "");
		m.files = files;
		m.nr_files = nf;
		text = store_manifest_encode(&m, kr->fleet_key, kr->fleet_key_len, err, errlen);
		if (!text)
			r = -ENOMEM;
	}
	char key[S3_KEY_MAX];
	if (!r)
		r = gen_key(src->name, m.generation, key, sizeof(key));
	if (!r) {
		r = s3_put(c, key, text, strlen(text), S3_IF_NONE_MATCH, err, errlen);
		if (r == -EEXIST && src->fenced)
			r = errmsg(err, errlen, -ESTALE,
				   "sandbox %s: generation %llu is committed already: another host "
				   "took it over (this host's lease is gone)",
				   src->name, (unsigned long long)m.generation);
		else if (r == -EEXIST)
			errmsg(err, errlen, r,
			       "sandbox %s: generation %llu was committed by another writer first",
			       src->name, (unsigned long long)m.generation);
	}
	if (!r) {
		st->generation = m.generation;
		st->files = nf;
	}
	if (cdfd >= 0)
		close(cdfd);
	free(text);
	free(names);
	free(files);
	free(ch);
	return r;
}

/* GETs blob f into a fresh unnamed file and places it as `as` beneath dfd. */
static int fetch_one(struct s3_client *c, const struct store_file *f, const char *as, int dfd,
		     struct store_sync_stats *st, char *err, size_t errlen)
{
	char key[S3_KEY_MAX];
	blob_key(f->digest, key, sizeof(key));
	int fd = openat(dfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	if (fd < 0)
		return errmsg(err, errlen, -errno, "%s: %s", f->name, strerror(errno));
	/* At most the header, a full run map and the file itself. */
	uint64_t cap = STORE_BLOB_HDR + 16ull * STORE_BLOB_MAX_RUNS + f->size, got = 0;
	int r = s3_get_fd(c, key, 0, 0, fd, 0, cap, &got, err, errlen);
	if (!r) {
		struct store_file as_f = *f;
		snprintf(as_f.name, sizeof(as_f.name), "%s", as);
		r = store_place_file(fd, got, &as_f, dfd, err, errlen);
		st->bytes_sent += got;
		st->blobs_sent++;
	} else {
		char why[512]; /* err is also the destination: copied first */
		snprintf(why, sizeof(why), "%s", err);
		r = errmsg(err, errlen, r, "%s (blob %s): %s", f->name,
			   key + strlen(STORE_BLOB_PREFIX), why);
	}
	close(fd);
	return r;
}

int store_manifest_fetch(struct s3_client *c, const char *name, uint64_t gen,
			 const struct store_keyring *kr, struct store_manifest *m, char *err,
			 size_t errlen)
{
	memset(m, 0, sizeof(*m));
	char key[S3_KEY_MAX];
	int r = gen_key(name, gen, key, sizeof(key));
	char *buf = r ? NULL : malloc(STORE_MANIFEST_MAX);
	size_t got = 0;
	if (!r && !buf)
		r = -ENOMEM;
	if (!r)
		r = s3_get(c, key, 0, 0, buf, STORE_MANIFEST_MAX, &got, err, errlen);
	if (!r)
		r = store_manifest_decode(buf, got, kr->fleet_key, kr->fleet_key_len, m, err,
					  errlen);
	free(buf);
	if (!r && (strcmp(m->sandbox, name) || m->generation != gen))
		r = errmsg(err, errlen, -EBADMSG,
			   "%s: the manifest is of sandbox %s generation %llu, not this one", key,
			   m->sandbox, (unsigned long long)m->generation);
	if (r)
		store_manifest_free(m);
	return r;
}

int store_fetch_generation(struct s3_client *c, const char *name, uint64_t gen,
			   const struct store_keyring *kr, int chain_dfd, int images_dfd,
			   struct sbx_lazy *lazy, struct store_manifest *m,
			   struct store_sync_stats *st, char *err, size_t errlen)
{
	memset(st, 0, sizeof(*st));
	memset(m, 0, sizeof(*m));
	int r = 0;
	if (!gen)
		r = store_newest_generation(c, name, &gen, err, errlen);
	if (!r && !gen)
		r = errmsg(err, errlen, -ENOENT, "sandbox %s is not in the store", name);
	if (!r)
		r = store_manifest_fetch(c, name, gen, kr, m, err, errlen);
	if (r)
		return r;
	for (size_t i = 0; !r && i < m->nr_files; i++) {
		const struct store_file *f = &m->files[i];
		if (!store_image_name(f->name)) {
			uint64_t got = 0;
			r = lazy && store_lazy_name(f->name)
				? lazy_blob_place(c, f, chain_dfd, lazy, &got, err, errlen)
				: -ENOENT;
			st->bytes_sent += got;
			if (r == -ENOENT) /* no chunk list: whole */
				r = fetch_one(c, f, f->name, chain_dfd, st, err, errlen);
			continue;
		}
		/* An image: the host's cache, by digest; one already there was checked when
		 * it was placed. */
		char hex[DIGEST_HEX_LEN];
		digest_hex(f->digest, hex);
		struct stat sb;
		if (fstatat(images_dfd, hex, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
		    S_ISREG(sb.st_mode) && (uint64_t)sb.st_size == f->size)
			continue;
		r = fetch_one(c, f, hex, images_dfd, st, err, errlen);
		if (r == -EEXIST) /* another fetch placed it meanwhile */
			r = 0;
	}
	if (!r) {
		st->generation = gen;
		st->files = m->nr_files;
	} else {
		store_manifest_free(m);
	}
	return r;
}

int store_put_tombstone(struct s3_client *c, const char *name, char *err, size_t errlen)
{
	char key[S3_KEY_MAX + 16], base[S3_KEY_MAX];
	int r = store_name_dir(name, base, sizeof(base), err, errlen);
	if (r)
		return r;
	snprintf(key, sizeof(key), "%s" STORE_TOMBSTONE, base);
	r = s3_put(c, key, "removed\n", 8, S3_IF_NONE_MATCH, err, errlen);
	return r == -EEXIST ? 0 : r;
}

void store_stats_note_upload(int dfd, int r, const struct store_sync_stats *st)
{
	if (r) {
		store_stats_add(dfd, &(struct store_stats){.upload_errors = 1});
		return;
	}
	store_stats_add(dfd, &(struct store_stats){.uploaded_bytes = st->bytes_sent,
						   .uploaded_blobs = st->blobs_sent,
						   .commits = 1,
						   .generation = st->generation,
						   .last_commit_ms = realtime_ms()});
}
