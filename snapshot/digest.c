/* Content digests of committed chain files (memory layers, state files, frozen disk layers). */
#include "snapshot/digest.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/evp.h>

#include "common/byteorder.h"
#include "common/dirfd_io.h"
#include "common/file_io.h"
#include "common/hex.h"
#include "devices/overlay.h"

/* SHA-256 of 1 MiB of zeros (tests/unit/test_digest.c recomputes it). */
const uint8_t digest_zero_chunk[DIGEST_LEN] = {
    0x30, 0xe1, 0x49, 0x55, 0xeb, 0xf1, 0x35, 0x22, 0x66, 0xdc, 0x2f, 0xf8, 0x06, 0x7e, 0x68, 0x10,
    0x46, 0x07, 0xe7, 0x50, 0xab, 0xb9, 0xd3, 0xb3, 0x65, 0x82, 0xb8, 0xaf, 0x90, 0x9f, 0xcb, 0x58,
};

static const char tree_label[] = "cove-sha256-tree";

struct tree {
	EVP_MD_CTX *top, *chunk;
	uint8_t *rec; /* NULL, or room for every chunk's SHA-256 (digest_stream_keep_chunks) */
	uint64_t nrec, caprec;
};

static int tree_begin(struct tree *t, uint64_t size)
{
	t->rec = NULL;
	t->nrec = t->caprec = 0;
	t->top = EVP_MD_CTX_new();
	t->chunk = EVP_MD_CTX_new();
	uint8_t head[sizeof(tree_label) + 12];
	memcpy(head, tree_label, sizeof(tree_label)); /* with its NUL */
	put_le64(head + sizeof(tree_label), size);
	put_le32(head + sizeof(tree_label) + 8, DIGEST_CHUNK);
	if (!t->top || !t->chunk || !EVP_DigestInit_ex(t->top, EVP_sha256(), NULL) ||
	    !EVP_DigestUpdate(t->top, head, sizeof(head)))
		return -ENOMEM;
	return 0;
}

static void tree_end(struct tree *t)
{
	EVP_MD_CTX_free(t->top);
	EVP_MD_CTX_free(t->chunk);
	free(t->rec);
	t->rec = NULL;
}

static bool all_zero(const uint8_t *p, size_t n)
{
	for (; n && ((uintptr_t)p & 7); n--, p++)
		if (*p)
			return false;
	const uint64_t *w = (const uint64_t *)p;
	size_t words = n / 8;
	for (size_t i = 0; i < words; i++)
		if (w[i])
			return false;
	for (size_t i = words * 8; i < n; i++)
		if (p[i])
			return false;
	return true;
}

/* One chunk (`zero`: known to read as zeros) into the top-level hash. */
static int tree_chunk(struct tree *t, const uint8_t *p, size_t n, bool zero)
{
	uint8_t d[DIGEST_LEN];
	unsigned dl = 0;
	if (n == DIGEST_CHUNK && (zero || all_zero(p, n))) {
		memcpy(d, digest_zero_chunk, DIGEST_LEN);
	} else if (!EVP_DigestInit_ex(t->chunk, EVP_sha256(), NULL) ||
		   !EVP_DigestUpdate(t->chunk, p, n) || !EVP_DigestFinal_ex(t->chunk, d, &dl)) {
		return -EIO;
	}
	if (t->rec && t->nrec < t->caprec)
		memcpy(t->rec + DIGEST_LEN * t->nrec++, d, DIGEST_LEN);
	return EVP_DigestUpdate(t->top, d, DIGEST_LEN) ? 0 : -EIO;
}

static int tree_finish(struct tree *t, uint8_t out[DIGEST_LEN])
{
	unsigned dl = 0;
	return EVP_DigestFinal_ex(t->top, out, &dl) && dl == DIGEST_LEN ? 0 : -EIO;
}

struct digest_stream {
	struct tree t;
	uint64_t size, fed;
	size_t used; /* bytes of the current chunk in buf */
	uint8_t *buf;
};

int digest_stream_new(uint64_t size, struct digest_stream **out)
{
	struct digest_stream *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->size = size;
	s->buf = malloc(DIGEST_CHUNK);
	int r = s->buf ? tree_begin(&s->t, size) : -ENOMEM;
	if (r) {
		digest_stream_free(s);
		return r;
	}
	*out = s;
	return 0;
}

void digest_stream_free(struct digest_stream *s)
{
	if (!s)
		return;
	tree_end(&s->t);
	free(s->buf);
	free(s);
}

/* n bytes of p (NULL: zeros) in order. */
static int stream_add(struct digest_stream *s, const uint8_t *p, uint64_t n)
{
	if (n > s->size - s->fed)
		return -EOVERFLOW;
	while (n) {
		if (!s->used && !p && n >= DIGEST_CHUNK) {
			int r = tree_chunk(&s->t, s->buf, DIGEST_CHUNK, true);
			if (r)
				return r;
			n -= DIGEST_CHUNK;
			s->fed += DIGEST_CHUNK;
			continue;
		}
		size_t k = DIGEST_CHUNK - s->used;
		if (k > n)
			k = (size_t)n;
		if (p) {
			memcpy(s->buf + s->used, p, k);
			p += k;
		} else {
			memset(s->buf + s->used, 0, k);
		}
		s->used += k;
		s->fed += k;
		n -= k;
		if (s->used == DIGEST_CHUNK) {
			int r = tree_chunk(&s->t, s->buf, DIGEST_CHUNK, false);
			if (r)
				return r;
			s->used = 0;
		}
	}
	return 0;
}

int digest_stream_keep_chunks(struct digest_stream *s)
{
	uint64_t n = digest_chunks_of(s->size);
	if (n > DIGEST_CHUNKS_MAX)
		return -EFBIG;
	s->t.rec = malloc(n ? n * DIGEST_LEN : 1);
	s->t.caprec = n;
	return s->t.rec ? 0 : -ENOMEM;
}

const uint8_t *digest_stream_chunks(const struct digest_stream *s, uint64_t *n)
{
	*n = s->t.nrec;
	return s->t.rec;
}

uint64_t digest_chunks_of(uint64_t size)
{
	return (size + DIGEST_CHUNK - 1) / DIGEST_CHUNK;
}

int digest_from_chunks(uint64_t size, const uint8_t *hashes, uint64_t n, uint8_t out[DIGEST_LEN])
{
	if (n != digest_chunks_of(size))
		return -EINVAL;
	struct tree t;
	int r = tree_begin(&t, size);
	if (!r && n && !EVP_DigestUpdate(t.top, hashes, (size_t)(n * DIGEST_LEN)))
		r = -EIO;
	if (!r)
		r = tree_finish(&t, out);
	tree_end(&t);
	return r;
}

int digest_chunk(const void *p, size_t len, uint8_t out[DIGEST_LEN])
{
	if (len == DIGEST_CHUNK && all_zero(p, len)) {
		memcpy(out, digest_zero_chunk, DIGEST_LEN);
		return 0;
	}
	unsigned dl = 0;
	return EVP_Digest(p, len, out, &dl, EVP_sha256(), NULL) && dl == DIGEST_LEN ? 0 : -EIO;
}

int digest_stream_feed(struct digest_stream *s, const void *p, size_t n)
{
	return stream_add(s, p, n);
}

int digest_stream_zeros(struct digest_stream *s, uint64_t n)
{
	return stream_add(s, NULL, n);
}

int digest_stream_finish(struct digest_stream *s, uint8_t out[DIGEST_LEN])
{
	if (s->fed != s->size)
		return -EIO;
	if (s->used) {
		int r = tree_chunk(&s->t, s->buf, s->used, false);
		if (r)
			return r;
		s->used = 0;
	}
	return tree_finish(&s->t, out);
}

int digest_buf(const void *p, size_t len, uint8_t out[DIGEST_LEN])
{
	struct tree t;
	int r = tree_begin(&t, len);
	for (size_t off = 0; !r && off < len; off += DIGEST_CHUNK) {
		size_t n = len - off < DIGEST_CHUNK ? len - off : DIGEST_CHUNK;
		r = tree_chunk(&t, (const uint8_t *)p + off, n, false);
	}
	if (!r)
		r = tree_finish(&t, out);
	tree_end(&t);
	return r;
}

int digest_fd(int fd, uint8_t out[DIGEST_LEN])
{
	struct stat st;
	if (fstat(fd, &st) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode))
		return -EINVAL;
	uint64_t size = (uint64_t)st.st_size;
	uint8_t *buf = aligned_alloc(4096, DIGEST_CHUNK);
	if (!buf)
		return -ENOMEM;
	struct tree t;
	int r = tree_begin(&t, size);
	/* Where the next data is: chunks before it are holes and are not read at all. */
	uint64_t data = 0;
	for (uint64_t off = 0; !r && off < size; off += DIGEST_CHUNK) {
		size_t n = size - off < DIGEST_CHUNK ? (size_t)(size - off) : DIGEST_CHUNK;
		if (data < off) {
			off_t d = lseek(fd, (off_t)off, SEEK_DATA);
			/* ENXIO: only holes from here; any other error: read it all. */
			data = d >= 0 ? (uint64_t)d : errno == ENXIO ? size : off;
		}
		if (data >= off + n) {
			memset(buf, 0, n);
			r = tree_chunk(&t, buf, n, n == DIGEST_CHUNK);
			continue;
		}
		r = pread_full(fd, buf, n, (off_t)off);
		if (!r)
			r = tree_chunk(&t, buf, n, false);
	}
	if (!r)
		r = tree_finish(&t, out);
	tree_end(&t);
	free(buf);
	return r;
}

int digest_file_at(int dfd, const char *name, uint8_t out[DIGEST_LEN])
{
	int fd = dirfd_open(dfd, name, O_RDONLY);
	if (fd < 0)
		return fd;
	int r = digest_fd(fd, out);
	close(fd);
	return r;
}

void digest_hex(const uint8_t d[DIGEST_LEN], char out[DIGEST_HEX_LEN])
{
	hex_encode(d, DIGEST_LEN, out);
}

int digest_unhex(const char *s, uint8_t out[DIGEST_LEN])
{
	if (strnlen(s, 2 * DIGEST_LEN + 1) != 2 * DIGEST_LEN)
		return -EINVAL;
	for (int i = 0; i < 2 * DIGEST_LEN; i++)
		if (hex_digit(s[i]) < 0 || (s[i] >= 'A' && s[i] <= 'F'))
			return -EINVAL; /* lower case only: one spelling per digest */
	return hex_decode(s, out, DIGEST_LEN);
}

static int add_name(char (*names)[64], int max, int *n, const char *a, const char *b)
{
	if (*n >= max)
		return -E2BIG;
	if (snprintf(names[*n], 64, "%s%s", a, b) >= 64 || !dirfd_plain_name(names[*n]))
		return -EINVAL;
	for (int i = 0; i < *n; i++)
		if (!strcmp(names[i], names[*n]))
			return 0; /* named twice: listed once */
	(*n)++;
	return 0;
}

int digest_config_files(const char *json, size_t len, char (*names)[64], int max, int *n)
{
	*n = 0;
	json_t *root = json_loadb(json, len, 0, NULL);
	if (!root)
		return -EINVAL;
	int r = 0;
	json_t *disks = json_object_get(root, "disks");
	if (!json_is_object(root) || (disks && !json_is_array(disks))) {
		r = -EINVAL;
		goto out;
	}
	size_t i, k;
	json_t *d, *l;
	json_array_foreach(disks, i, d)
	{
		json_t *layers = json_object_get(d, "layers");
		if (!layers)
			continue;
		if (!json_is_array(layers)) {
			r = -EINVAL;
			goto out;
		}
		json_array_foreach(layers, k, l)
		{
			if (!json_is_string(l) || !dirfd_plain_name(json_string_value(l))) {
				r = -EINVAL;
				goto out;
			}
			const char *s = json_string_value(l);
			if ((r = add_name(names, max, n, s, "")) ||
			    (r = add_name(names, max, n, s, OVERLAY_MAP_SUFFIX)))
				goto out;
		}
	}
out:
	json_decref(root);
	return r;
}
