/* Retention and blob garbage collection (gc.h). */
#include "lifecycle/store/gc.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errmsg.h"

#define GC_MAX_KEYS (1u << 20) /* keys gc will hold in memory, at most */

struct keyset {
	struct s3_list_entry *e;
	size_t n, cap;
};

/* Every key under prefix, in the store's (sorted) order. */
static int list_all(struct s3_client *c, const char *prefix, struct keyset *ks, char *err,
		    size_t errlen)
{
	char token[S3_KEY_MAX + 1] = "";
	for (;;) {
		struct s3_list_page pg;
		int r = s3_list(c, prefix, token, S3_LIST_MAX, &pg, err, errlen);
		if (r)
			return r;
		if (ks->n + pg.n > GC_MAX_KEYS) {
			s3_list_page_free(&pg);
			return errmsg(err, errlen, -E2BIG, "gc: more than %u keys under %s",
				      GC_MAX_KEYS, prefix);
		}
		if (ks->n + pg.n > ks->cap) {
			size_t cap = (ks->n + pg.n) * 2;
			struct s3_list_entry *m = realloc(ks->e, cap * sizeof(*m));
			if (!m) {
				s3_list_page_free(&pg);
				return errmsg(err, errlen, -ENOMEM, "gc: out of memory");
			}
			ks->e = m;
			ks->cap = cap;
		}
		if (pg.n) /* an empty page may carry no array at all */
			memcpy(ks->e + ks->n, pg.entries, pg.n * sizeof(*pg.entries));
		ks->n += pg.n;
		bool more = pg.truncated && pg.next_token[0];
		snprintf(token, sizeof(token), "%s", pg.next_token);
		s3_list_page_free(&pg);
		if (!more)
			return 0;
	}
}

static int cmp_digest(const void *a, const void *b)
{
	return memcmp(a, b, DIGEST_LEN);
}

/* "sandboxes/NAME/gen/N.json" -> NAME, "templates/T/gen/N.json" -> "@T" (the store names of
 * sync.h, in the caller's buffer) and 1; else 0. */
static int gen_key_name(const char *key, char *name, size_t cap)
{
	bool tpl = !strncmp(key, STORE_TPL_PREFIX, strlen(STORE_TPL_PREFIX));
	const char *pre = tpl ? STORE_TPL_PREFIX : STORE_SBX_PREFIX;
	const char *p = key + strlen(pre), *slash;
	if (strncmp(key, pre, strlen(pre)) || !(slash = strchr(p, '/')) ||
	    strncmp(slash, "/gen/", 5) || (size_t)(slash - p) + tpl >= cap)
		return 0;
	if (tpl)
		name[0] = STORE_TPL_MARK;
	memcpy(name + tpl, p, (size_t)(slash - p));
	name[(slash - p) + tpl] = 0;
	return 1;
}

/* The kept manifests' digests into *kept (sorted); manifests past `keep` deleted. */
static int retain(struct s3_client *c, const struct store_keyring *kr, unsigned keep,
		  const struct keyset *sb, uint8_t (**kept)[DIGEST_LEN], size_t *nk,
		  struct store_gc_stats *st, char *err, size_t errlen)
{
	char *buf = malloc(STORE_MANIFEST_MAX);
	size_t cap = 0;
	int r = buf ? 0 : -ENOMEM;
	/* Keys sort by sandbox, then generation (20 digits): walk each sandbox's run back. */
	for (size_t i = 0; !r && i < sb->n;) {
		char name[SBX_NAME_MAX + 2], other[SBX_NAME_MAX + 2], tomb[S3_KEY_MAX + 16];
		char base[S3_KEY_MAX];
		size_t j = i;
		if (!gen_key_name(sb->e[i].key, name, sizeof(name))) {
			i++;
			continue;
		}
		while (j < sb->n && gen_key_name(sb->e[j].key, other, sizeof(other)) &&
		       !strcmp(name, other))
			j++;
		st->sandboxes++;
		if (store_name_dir(name, base, sizeof(base), NULL, 0)) {
			i = j; /* not a name of ours: its manifests are left alone */
			continue;
		}
		snprintf(tomb, sizeof(tomb), "%s" STORE_TOMBSTONE, base);
		/* "sandboxes/NAME/tombstone" sorts right after NAME's "gen/" keys. */
		bool removed = j < sb->n && !strcmp(sb->e[j].key, tomb);
		for (size_t k = i; !r && k < j; k++) {
			bool keepit = !removed && j - k <= keep;
			if (!keepit) {
				r = s3_delete(c, sb->e[k].key, err, errlen);
				st->manifests_removed += !r;
				continue;
			}
			size_t got = 0;
			struct store_manifest m;
			r = s3_get(c, sb->e[k].key, 0, 0, buf, STORE_MANIFEST_MAX, &got, err,
				   errlen);
			if (!r)
				r = store_manifest_decode(buf, got, kr->fleet_key,
							  kr->fleet_key_len, &m, err, errlen);
			if (r) {
				char why[400];
				snprintf(why, sizeof(why), "%s", err);
				r = errmsg(err, errlen, r, "gc: %s: %s: nothing deleted",
					   sb->e[k].key, why);
				break;
			}
			st->manifests_kept++;
			if (*nk + m.nr_files > cap) {
				cap = (*nk + m.nr_files) * 2;
				uint8_t(*g)[DIGEST_LEN] = realloc(*kept, cap * DIGEST_LEN);
				r = g ? 0 : -ENOMEM;
				if (g)
					*kept = g;
			}
			for (size_t f = 0; !r && f < m.nr_files; f++)
				memcpy((*kept)[(*nk)++], m.files[f].digest, DIGEST_LEN);
			store_manifest_free(&m);
		}
		i = j;
	}
	free(buf);
	if (!r && *nk)
		qsort(*kept, *nk, DIGEST_LEN, cmp_digest);
	return r;
}

int store_gc(struct s3_client *c, const struct store_keyring *kr, unsigned keep, int64_t grace_s,
	     int64_t now, struct store_gc_stats *st, char *err, size_t errlen)
{
	memset(st, 0, sizeof(*st));
	if (!keep)
		return errmsg(err, errlen, -EINVAL, "gc: keep at least one generation");
	struct keyset sb = {0}, bl = {0};
	uint8_t(*kept)[DIGEST_LEN] = NULL;
	size_t nk = 0;
	/* Manifests first: a blob listed after them that a new manifest names is young. */
	struct keyset tp = {0};
	int r = list_all(c, STORE_SBX_PREFIX, &sb, err, errlen);
	if (!r)
		r = retain(c, kr, keep, &sb, &kept, &nk, st, err, errlen);
	/* Templates' manifests too: their blobs are shared with the sandboxes made from them. */
	if (!r)
		r = list_all(c, STORE_TPL_PREFIX, &tp, err, errlen);
	if (!r)
		r = retain(c, kr, keep, &tp, &kept, &nk, st, err, errlen);
	if (!r)
		r = list_all(c, STORE_BLOB_PREFIX, &bl, err, errlen);
	/*
	 * The two-step order: uploads (blobs, then manifest) that began after the manifest listing
	 * send blobs younger than the grace period, so they are never the ones deleted here.
	 */
	for (size_t i = 0; !r && i < bl.n; i++) {
		uint8_t d[DIGEST_LEN];
		st->blobs++;
		if (digest_unhex(bl.e[i].key + strlen(STORE_BLOB_PREFIX), d))
			continue; /* not a blob name of ours: left alone */
		if (nk && bsearch(d, kept, nk, DIGEST_LEN, cmp_digest)) {
			st->blobs_kept++;
			continue;
		}
		if (!bl.e[i].mtime || bl.e[i].mtime > now - grace_s) {
			st->blobs_young++;
			continue;
		}
		r = s3_delete(c, bl.e[i].key, err, errlen);
		if (!r) {
			st->blobs_removed++;
			st->bytes_removed += bl.e[i].size;
			/* Its chunk list (a memory layer's) goes with it; none is success. */
			char ck[S3_KEY_MAX];
			store_chunks_key(d, ck, sizeof(ck));
			r = s3_delete(c, ck, err, errlen);
		}
	}
	free(sb.e);
	free(tp.e);
	free(bl.e);
	free(kept);
	return r;
}
