/* Store blobs: a file's data runs packed with their map, and checked back (blob.h). */
#include "lifecycle/store/blob.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/byteorder.h"
#include "common/errmsg.h"
#include "common/file_io.h"

#define COPY_BUF (1u << 20)

static int write_header(int out, uint64_t size, const struct file_run *runs, size_t n)
{
	size_t len = STORE_BLOB_HDR + 16 * n;
	uint8_t *h = calloc(1, len);
	if (!h)
		return -ENOMEM;
	memcpy(h, STORE_BLOB_MAGIC, 8);
	put_le64(h + 8, size);
	put_le32(h + 16, (uint32_t)n);
	for (size_t i = 0; i < n; i++) {
		put_le64(h + STORE_BLOB_HDR + 16 * i, runs[i].off);
		put_le64(h + STORE_BLOB_HDR + 16 * i + 8, runs[i].len);
	}
	int r = pwrite_full(out, h, len, 0);
	free(h);
	return r;
}

/*
 * The runs' bytes from `in` into `out` at `pos`, hashed as they go (holes between them as zeros):
 * what is hashed is exactly what is written.
 */
static int copy_runs(int in, int out, uint64_t pos, uint64_t size, const struct file_run *runs,
		     size_t n, struct digest_stream *ds)
{
	uint8_t *buf = malloc(COPY_BUF);
	if (!buf)
		return -ENOMEM;
	uint64_t at = 0; /* the file offset hashed up to */
	int r = 0;
	for (size_t i = 0; !r && i < n; i++) {
		r = digest_stream_zeros(ds, runs[i].off - at);
		for (uint64_t done = 0; !r && done < runs[i].len;) {
			size_t k =
			    runs[i].len - done < COPY_BUF ? (size_t)(runs[i].len - done) : COPY_BUF;
			r = pread_full(in, buf, k, (off_t)(runs[i].off + done));
			if (!r)
				r = digest_stream_feed(ds, buf, k);
			if (!r)
				r = pwrite_full(out, buf, k, (off_t)pos);
			pos += k;
			done += k;
		}
		at = runs[i].off + runs[i].len;
	}
	if (!r)
		r = digest_stream_zeros(ds, size - at);
	free(buf);
	return r;
}

int store_blob_pack(int in, int out, uint8_t digest[DIGEST_LEN], uint64_t *blob_len,
		    uint8_t **chunks, char *err, size_t errlen)
{
	if (chunks)
		*chunks = NULL;
	struct stat st;
	if (fstat(in, &st) < 0)
		return errmsg(err, errlen, -errno, "blob: %s", strerror(errno));
	if (!S_ISREG(st.st_mode))
		return errmsg(err, errlen, -EINVAL, "blob: not a regular file");
	uint64_t size = (uint64_t)st.st_size;
	if (size > STORE_BLOB_MAX_FILE)
		return errmsg(err, errlen, -EFBIG, "blob: file of %llu bytes is over the cap",
			      (unsigned long long)size);
	struct file_run *runs = NULL;
	size_t n = 0;
	int r = file_data_runs(in, size, STORE_BLOB_MAX_RUNS, &runs, &n);
	if (r)
		return errmsg(err, errlen, r, "blob: %s", strerror(-r));
	struct digest_stream *ds = NULL;
	r = digest_stream_new(size, &ds);
	if (!r && chunks)
		r = digest_stream_keep_chunks(ds);
	if (!r)
		r = write_header(out, size, runs, n);
	uint64_t data = 0;
	for (size_t i = 0; i < n; i++)
		data += runs[i].len;
	if (!r)
		r = copy_runs(in, out, STORE_BLOB_HDR + 16 * (uint64_t)n, size, runs, n, ds);
	if (!r)
		r = digest_stream_finish(ds, digest);
	if (!r && (fstat(in, &st) < 0 || (uint64_t)st.st_size != size))
		r = -EIO; /* changed while packed */
	if (!r && chunks) {
		uint64_t nc;
		const uint8_t *h = digest_stream_chunks(ds, &nc);
		*chunks = malloc(nc ? nc * DIGEST_LEN : 1);
		if (!*chunks)
			r = -ENOMEM;
		else if (nc)
			memcpy(*chunks, h, nc * DIGEST_LEN);
	}
	digest_stream_free(ds);
	free(runs);
	if (r)
		return errmsg(err, errlen, r, "blob: packing failed: %s", strerror(-r));
	*blob_len = STORE_BLOB_HDR + 16 * (uint64_t)n + data;
	return 0;
}

int store_blob_header(const uint8_t h[STORE_BLOB_HDR], uint64_t blob_len, uint64_t max_size,
		      const char *what, struct store_blob_info *info, char *err, size_t errlen)
{
	if (blob_len < STORE_BLOB_HDR)
		return errmsg(err, errlen, -EBADMSG, "%s: blob shorter than its header", what);
	if (memcmp(h, STORE_BLOB_MAGIC, 8) || get_le32(h + 20))
		return errmsg(err, errlen, -EBADMSG, "%s: not a cove blob (bad magic or flags)",
			      what);
	info->size = get_le64(h + 8);
	info->nr_runs = get_le32(h + 16);
	if (info->size > max_size || info->size > STORE_BLOB_MAX_FILE)
		return errmsg(err, errlen, -EFBIG,
			      "%s: blob claims a file of %llu bytes, over %llu", what,
			      (unsigned long long)info->size, (unsigned long long)max_size);
	if (info->nr_runs > STORE_BLOB_MAX_RUNS ||
	    STORE_BLOB_HDR + 16 * (uint64_t)info->nr_runs > blob_len)
		return errmsg(err, errlen, -EBADMSG, "%s: blob run map of %u runs does not fit",
			      what, info->nr_runs);
	return 0;
}

int store_blob_runs(const uint8_t *m, uint64_t blob_len, const char *what,
		    struct store_blob_info *info, struct file_run **runs, char *err, size_t errlen)
{
	size_t mlen = 16 * (size_t)info->nr_runs;
	struct file_run *e = calloc(info->nr_runs ? info->nr_runs : 1, sizeof(*e));
	int r = e ? 0 : -ENOMEM;
	uint64_t end = 0, data = 0;
	for (uint32_t i = 0; !r && i < info->nr_runs; i++) {
		e[i].off = get_le64(m + 16 * i);
		e[i].len = get_le64(m + 16 * i + 8);
		/* In order, apart, non-empty, inside the file (no sum can wrap: all <= 2^40). */
		if (e[i].len == 0 || e[i].off < end || e[i].off > info->size ||
		    e[i].len > info->size - e[i].off)
			r = errmsg(err, errlen, -EBADMSG,
				   "%s: blob run %u (offset %llu, %llu bytes) is out of order or "
				   "outside the file",
				   what, i, (unsigned long long)e[i].off,
				   (unsigned long long)e[i].len);
		end = e[i].off + e[i].len;
		data += e[i].len;
	}
	info->data_off = STORE_BLOB_HDR + mlen;
	info->data_len = data;
	if (!r && info->data_off + data != blob_len)
		r = errmsg(err, errlen, -EBADMSG, "%s: blob is %llu bytes, its map says %llu", what,
			   (unsigned long long)blob_len,
			   (unsigned long long)(info->data_off + data));
	if (r) {
		free(e);
		if (r == -ENOMEM)
			return errmsg(err, errlen, r, "%s: %s", what, strerror(-r));
		return r;
	}
	*runs = e;
	return 0;
}

/* Reads and checks the header and run map: *runs (malloc'ed) on success. */
static int read_map(int blob, uint64_t blob_len, uint64_t max_size, const char *what,
		    struct store_blob_info *info, struct file_run **runs, char *err, size_t errlen)
{
	uint8_t h[STORE_BLOB_HDR];
	if (blob_len < STORE_BLOB_HDR || pread_full(blob, h, sizeof(h), 0))
		return errmsg(err, errlen, -EBADMSG, "%s: blob shorter than its header", what);
	int r = store_blob_header(h, blob_len, max_size, what, info, err, errlen);
	if (r)
		return r;
	size_t mlen = 16 * (size_t)info->nr_runs;
	uint8_t *m = malloc(mlen ? mlen : 1);
	r = !m ? -ENOMEM : pread_full(blob, m, mlen, STORE_BLOB_HDR);
	if (r)
		r = errmsg(err, errlen, r, "%s: %s", what, strerror(-r));
	else
		r = store_blob_runs(m, blob_len, what, info, runs, err, errlen);
	free(m);
	return r;
}

int store_blob_verify(int blob, uint64_t blob_len, uint64_t max_size,
		      const uint8_t want[DIGEST_LEN], const char *what,
		      struct store_blob_info *info, char *err, size_t errlen)
{
	struct file_run *runs = NULL;
	int r = read_map(blob, blob_len, max_size, what, info, &runs, err, errlen);
	if (r)
		return r;
	struct digest_stream *ds = NULL;
	uint8_t *buf = malloc(COPY_BUF);
	r = buf ? digest_stream_new(info->size, &ds) : -ENOMEM;
	uint64_t pos = info->data_off, at = 0;
	for (uint32_t i = 0; !r && i < info->nr_runs; i++) {
		r = digest_stream_zeros(ds, runs[i].off - at);
		for (uint64_t done = 0; !r && done < runs[i].len;) {
			size_t k =
			    runs[i].len - done < COPY_BUF ? (size_t)(runs[i].len - done) : COPY_BUF;
			r = pread_full(blob, buf, k, (off_t)pos);
			if (!r)
				r = digest_stream_feed(ds, buf, k);
			pos += k;
			done += k;
		}
		at = runs[i].off + runs[i].len;
	}
	uint8_t got[DIGEST_LEN];
	if (!r)
		r = digest_stream_zeros(ds, info->size - at);
	if (!r)
		r = digest_stream_finish(ds, got);
	digest_stream_free(ds);
	free(buf);
	free(runs);
	if (r)
		return errmsg(err, errlen, r, "%s: reading the blob: %s", what, strerror(-r));
	if (memcmp(got, want, DIGEST_LEN)) {
		char g[DIGEST_HEX_LEN], w[DIGEST_HEX_LEN];
		digest_hex(got, g);
		digest_hex(want, w);
		return errmsg(err, errlen, -EILSEQ,
			      "%s: blob content has digest %s, not the %s it is named by", what, g,
			      w);
	}
	return 0;
}

int store_blob_unpack(int blob, const struct store_blob_info *info, int out, char *err,
		      size_t errlen)
{
	uint8_t *m = malloc(16 * (size_t)info->nr_runs + 1), *buf = malloc(COPY_BUF);
	int r =
	    !m || !buf ? -ENOMEM : pread_full(blob, m, 16 * (size_t)info->nr_runs, STORE_BLOB_HDR);
	uint64_t pos = info->data_off;
	for (uint32_t i = 0; !r && i < info->nr_runs; i++) {
		uint64_t off = get_le64(m + 16 * i), len = get_le64(m + 16 * i + 8);
		for (uint64_t done = 0; !r && done < len;) {
			size_t k = len - done < COPY_BUF ? (size_t)(len - done) : COPY_BUF;
			r = pread_full(blob, buf, k, (off_t)pos);
			if (!r)
				r = pwrite_full(out, buf, k, (off_t)(off + done));
			pos += k;
			done += k;
		}
	}
	if (!r && ftruncate(out, (off_t)info->size) < 0)
		r = -errno;
	free(m);
	free(buf);
	return r ? errmsg(err, errlen, r, "unpacking a blob: %s", strerror(-r)) : 0;
}
