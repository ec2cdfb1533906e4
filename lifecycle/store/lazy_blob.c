/* A memory layer's blob read by ranges (lazy_blob.h). */
#include "lifecycle/store/lazy_blob.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/errmsg.h"
#include "lifecycle/lazy_files.h"
#include "lifecycle/store/manifest.h"
#include "lifecycle/store/sync.h"

int lazy_blob_open(struct s3_client *c, const char *what, const uint8_t d[DIGEST_LEN],
		   uint64_t size, struct lazy_blob *b, char *err, size_t errlen)
{
	memset(b, 0, sizeof(*b));
	snprintf(b->what, sizeof(b->what), "%s", what);
	memcpy(b->digest, d, DIGEST_LEN);
	b->nchunks = digest_chunks_of(size);
	if (size > STORE_BLOB_MAX_FILE || b->nchunks > DIGEST_CHUNKS_MAX)
		return errmsg(err, errlen, -EFBIG, "%s: %llu bytes is over the cap", what,
			      (unsigned long long)size);
	char key[S3_KEY_MAX];
	store_chunks_key(d, key, sizeof(key));
	size_t want = (size_t)b->nchunks * DIGEST_LEN, got = 0;
	b->chunks = malloc(want ? want : 1);
	if (!b->chunks)
		return -ENOMEM;
	char e2[512] = "";
	int r = s3_get(c, key, 0, 0, b->chunks, want, &got, e2, sizeof(e2));
	if (r == -ENOENT) {
		lazy_blob_close(b);
		return -ENOENT;
	}
	uint8_t again[DIGEST_LEN];
	if (!r && got != want)
		r = errmsg(e2, sizeof(e2), -EBADMSG, "its chunk list is %zu bytes, not %zu", got,
			   want);
	if (!r && (digest_from_chunks(size, b->chunks, b->nchunks, again) ||
		   memcmp(again, d, DIGEST_LEN)))
		r = errmsg(e2, sizeof(e2), -EILSEQ,
			   "its chunk list does not give the digest it is named by");
	/* The blob: its length, header and run map. */
	struct s3_object_info oi;
	store_blob_key(d, key, sizeof(key));
	if (!r)
		r = s3_head(c, key, &oi, e2, sizeof(e2));
	uint8_t h[STORE_BLOB_HDR];
	if (!r && oi.size < STORE_BLOB_HDR)
		r = errmsg(e2, sizeof(e2), -EBADMSG, "blob shorter than its header");
	if (!r)
		r = s3_get(c, key, 0, STORE_BLOB_HDR, h, sizeof(h), &got, e2, sizeof(e2));
	if (!r && got != sizeof(h))
		r = errmsg(e2, sizeof(e2), -EBADMSG, "short blob header");
	if (!r)
		r = store_blob_header(h, oi.size, size, what, &b->info, e2, sizeof(e2));
	if (!r && b->info.size != size)
		r = errmsg(e2, sizeof(e2), -EBADMSG,
			   "blob holds %llu bytes, the manifest says %llu",
			   (unsigned long long)b->info.size, (unsigned long long)size);
	size_t mlen = r ? 0 : 16 * (size_t)b->info.nr_runs;
	uint8_t *m = r ? NULL : malloc(mlen ? mlen : 1);
	if (!r && !m)
		r = -ENOMEM;
	if (!r && mlen)
		r = s3_get(c, key, STORE_BLOB_HDR, mlen, m, mlen, &got, e2, sizeof(e2));
	if (!r && mlen && got != mlen)
		r = errmsg(e2, sizeof(e2), -EBADMSG, "short run map");
	if (!r)
		r = store_blob_runs(m, oi.size, what, &b->info, &b->runs, e2, sizeof(e2));
	free(m);
	if (!r) {
		b->run_at = malloc(sizeof(uint64_t) * (b->info.nr_runs + 1u));
		if (!b->run_at)
			r = -ENOMEM;
		uint64_t at = b->info.data_off;
		for (uint32_t i = 0; !r && i < b->info.nr_runs; i++) {
			b->run_at[i] = at;
			at += b->runs[i].len;
		}
	}
	if (r) {
		lazy_blob_close(b);
		return errmsg(err, errlen, r, "%s (blob %s): %s", what,
			      key + strlen(STORE_BLOB_PREFIX), e2[0] ? e2 : strerror(-r));
	}
	return 0;
}

void lazy_blob_close(struct lazy_blob *b)
{
	free(b->runs);
	free(b->run_at);
	free(b->chunks);
	b->runs = NULL;
	b->run_at = NULL;
	b->chunks = NULL;
}

void lazy_blob_chunk_range(const struct lazy_blob *b, uint64_t k, uint64_t *lo, uint64_t *hi)
{
	*lo = k * DIGEST_CHUNK;
	*hi = *lo + DIGEST_CHUNK < b->info.size ? *lo + DIGEST_CHUNK : b->info.size;
}

/* The first run that ends after `at` (binary search), or nr_runs. */
static uint32_t first_run(const struct lazy_blob *b, uint64_t at)
{
	uint32_t lo = 0, hi = b->info.nr_runs;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (b->runs[mid].off + b->runs[mid].len <= at)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

int lazy_blob_fetch_chunk(struct s3_client *c, const struct lazy_blob *b, uint64_t k, uint8_t *buf,
			  int out, uint64_t *fetched, char *err, size_t errlen)
{
	uint64_t lo, hi;
	*fetched = 0;
	if (k >= b->nchunks)
		return errmsg(err, errlen, -ERANGE, "%s: no chunk %llu", b->what,
			      (unsigned long long)k);
	lazy_blob_chunk_range(b, k, &lo, &hi);
	uint32_t i = first_run(b, lo), j = i;
	while (j < b->info.nr_runs && b->runs[j].off < hi)
		j++;
	memset(buf, 0, DIGEST_CHUNK);
	if (j > i) { /* runs i..j-1 meet the chunk: their bytes there are one range of the blob */
		uint64_t from = b->run_at[i] + (lo > b->runs[i].off ? lo - b->runs[i].off : 0);
		const struct file_run *l = &b->runs[j - 1];
		uint64_t to =
		    b->run_at[j - 1] + ((l->off + l->len < hi ? l->off + l->len : hi) - l->off);
		char key[S3_KEY_MAX];
		store_blob_key(b->digest, key, sizeof(key));
		size_t n = (size_t)(to - from), got = 0;
		if (n > DIGEST_CHUNK)
			return errmsg(err, errlen, -EBADMSG, "%s: chunk %llu maps past its size",
				      b->what, (unsigned long long)k);
		/* Gathered at the buffer's end, then moved down into place. */
		uint8_t *tmp = buf + (DIGEST_CHUNK - n);
		int r = s3_get(c, key, from, n, tmp, n, &got, err, errlen);
		if (r)
			return r;
		if (got != n)
			return errmsg(err, errlen, -EBADMSG, "%s: chunk %llu: short read", b->what,
				      (unsigned long long)k);
		*fetched = got;
		/* Scatter, lowest offset first: a run's place never lies past its source. */
		uint64_t src = 0;
		for (uint32_t q = i; q < j; q++) {
			uint64_t a = b->runs[q].off > lo ? b->runs[q].off : lo;
			uint64_t e = b->runs[q].off + b->runs[q].len < hi
					 ? b->runs[q].off + b->runs[q].len
					 : hi;
			memmove(buf + (a - lo), tmp + src, (size_t)(e - a));
			src += e - a;
		}
		/* Zero what lies between the runs (gathered bytes were there). */
		uint64_t at = lo;
		for (uint32_t q = i; q < j; q++) {
			uint64_t a = b->runs[q].off > lo ? b->runs[q].off : lo;
			if (a > at)
				memset(buf + (at - lo), 0, (size_t)(a - at));
			uint64_t e = b->runs[q].off + b->runs[q].len;
			at = e < hi ? e : hi;
		}
		if (hi > at)
			memset(buf + (at - lo), 0, (size_t)(hi - at));
	}
	uint8_t d[DIGEST_LEN];
	int r = digest_chunk(buf, (size_t)(hi - lo), d);
	if (r)
		return errmsg(err, errlen, r, "%s: chunk %llu: %s", b->what, (unsigned long long)k,
			      strerror(-r));
	if (memcmp(d, b->chunks + k * DIGEST_LEN, DIGEST_LEN))
		return errmsg(err, errlen, -EILSEQ,
			      "%s: chunk %llu from the store does not match its SHA-256", b->what,
			      (unsigned long long)k);
	for (uint32_t q = i; q < j; q++) {
		uint64_t a = b->runs[q].off > lo ? b->runs[q].off : lo;
		uint64_t e =
		    b->runs[q].off + b->runs[q].len < hi ? b->runs[q].off + b->runs[q].len : hi;
		r = pwrite_full(out, buf + (a - lo), (size_t)(e - a), (off_t)a);
		if (r)
			return errmsg(err, errlen, r, "%s: writing chunk %llu: %s", b->what,
				      (unsigned long long)k, strerror(-r));
	}
	return 0;
}

int lazy_blob_chunk_present(const struct lazy_blob *b, uint64_t k, int fd, uint8_t *buf)
{
	uint64_t lo, hi;
	lazy_blob_chunk_range(b, k, &lo, &hi);
	off_t d = lseek(fd, (off_t)lo, SEEK_DATA);
	bool hole = d < 0 || (uint64_t)d >= hi;
	const uint8_t *want = b->chunks + k * DIGEST_LEN;
	if (hole) /* reads as zeros: present only if zeros are what it holds */
		return hi - lo == DIGEST_CHUNK && !memcmp(want, digest_zero_chunk, DIGEST_LEN);
	if (pread_full(fd, buf, (size_t)(hi - lo), (off_t)lo))
		return 0;
	uint8_t got[DIGEST_LEN];
	return digest_chunk(buf, (size_t)(hi - lo), got) == 0 && !memcmp(got, want, DIGEST_LEN);
}

uint64_t lazy_meta_chunks(uint64_t size)
{
	/* pages <= size / 4096; two bitmaps of one bit per page; header and alignment 4 KiB each */
	uint64_t end = 4096 + 2 * ((size / 4096 + 7) / 8) + 4096;
	uint64_t n = digest_chunks_of(end < size ? end : size);
	return n ? n : 1;
}

int lazy_blob_place(struct s3_client *c, const struct store_file *f, int chain_dfd,
		    struct sbx_lazy *lazy, uint64_t *fetched, char *err, size_t errlen)
{
	*fetched = 0;
	if (lazy->n >= SBX_LAZY_MAX_FILES)
		return -ENOENT; /* recorded files are capped: the rest come whole */
	struct lazy_blob b;
	if (strlen(f->name) >= SBX_LAZY_NAME_MAX)
		return -ENOENT;
	int r = lazy_blob_open(c, f->name, f->digest, f->size, &b, err, errlen);
	if (r)
		return r;
	int fd =
	    openat(chain_dfd, f->name, O_CREAT | O_EXCL | O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0600);
	uint8_t *buf = malloc(DIGEST_CHUNK);
	if (fd < 0 || !buf)
		r = errmsg(err, errlen, fd < 0 ? -errno : -ENOMEM, "%s: %s", f->name,
			   strerror(fd < 0 ? errno : ENOMEM));
	if (!r && ftruncate(fd, (off_t)f->size) < 0)
		r = errmsg(err, errlen, -errno, "%s: %s", f->name, strerror(errno));
	uint64_t meta = lazy_meta_chunks(f->size);
	for (uint64_t k = 0; !r && k < meta && k < b.nchunks; k++) {
		uint64_t got = 0;
		r = lazy_blob_fetch_chunk(c, &b, k, buf, fd, &got, err, errlen);
		*fetched += got;
	}
	if (!r && fsync(fd) < 0)
		r = errmsg(err, errlen, -errno, "%s: %s", f->name, strerror(errno));
	if (!r) {
		struct sbx_lazy_file *e = &lazy->f[lazy->n++];
		memcpy(e->name, f->name, strlen(f->name) + 1);
		e->size = f->size;
		memcpy(e->digest, f->digest, DIGEST_LEN);
	}
	if (r && fd >= 0)
		unlinkat(chain_dfd, f->name, 0);
	if (fd >= 0)
		close(fd);
	free(buf);
	lazy_blob_close(&b);
	return r;
}

size_t lazy_upload_files(int sbx_dfd, struct store_file **out)
{
	*out = NULL;
	struct sbx_lazy *l = calloc(1, sizeof(*l));
	char err[256];
	if (!l || sbx_lazy_load(sbx_dfd, l, err, sizeof(err)) || !l->n) {
		free(l);
		return 0;
	}
	struct store_file *f = calloc(l->n, sizeof(*f));
	size_t n = f ? l->n : 0;
	for (size_t i = 0; i < n; i++) {
		memcpy(f[i].name, l->f[i].name, sizeof(l->f[i].name));
		f[i].size = l->f[i].size;
		memcpy(f[i].digest, l->f[i].digest, DIGEST_LEN);
	}
	free(l);
	*out = f;
	return n;
}
