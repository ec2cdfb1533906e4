/* Snapshot state file: a checksummed header over typed sections (TLV); writer and bounds-checked
 * reader. */
#include "snapshot/state_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/byteorder.h"
#include "common/crc32.h"
#include "common/errmsg.h"
#include "common/file_io.h"

/*
 * Header (32 bytes, little-endian): magic[8], version u32, header size u32, body length u64,
 * body CRC-32 u32, header CRC-32 u32 (over the first 28 bytes).
 * Section: type u32, instance u32, length u32, reserved u32, payload, zero padding to 8.
 */
#define SEC_HDR 16

void state_buf_init(struct state_buf *b)
{
	memset(b, 0, sizeof(*b));
	b->cap = 64 * 1024;
	b->p = calloc(1, b->cap);
	if (!b->p)
		b->err = -ENOMEM;
	else
		b->len = STATE_HDR_SIZE;
}

void state_buf_free(struct state_buf *b)
{
	free(b->p);
	memset(b, 0, sizeof(*b));
}

static int reserve(struct state_buf *b, size_t more)
{
	if (b->err)
		return b->err;
	if (b->len + more > STATE_HDR_SIZE + (size_t)STATE_MAX_BODY)
		return b->err = -E2BIG;
	if (b->len + more <= b->cap)
		return 0;
	size_t cap = b->cap;
	while (cap < b->len + more)
		cap *= 2;
	uint8_t *p = realloc(b->p, cap);
	if (!p)
		return b->err = -ENOMEM;
	memset(p + b->cap, 0, cap - b->cap);
	b->p = p;
	b->cap = cap;
	return 0;
}

void state_put(struct state_buf *b, uint32_t type, uint32_t instance, const void *payload,
	       size_t len)
{
	if (len > STATE_MAX_SECTION) {
		if (!b->err)
			b->err = -E2BIG;
		return;
	}
	size_t padded = (len + 7) & ~(size_t)7;
	if (reserve(b, SEC_HDR + padded))
		return;
	uint8_t *h = b->p + b->len;
	put_le32(h, type);
	put_le32(h + 4, instance);
	put_le32(h + 8, (uint32_t)len);
	put_le32(h + 12, 0);
	if (len)
		memcpy(h + SEC_HDR, payload, len);
	memset(h + SEC_HDR + len, 0, padded - len);
	b->len += SEC_HDR + padded;
}

int state_finish(struct state_buf *b)
{
	if (b->err)
		return b->err;
	uint8_t *h = b->p;
	memcpy(h, STATE_MAGIC, 8);
	put_le32(h + 8, STATE_VERSION);
	put_le32(h + 12, STATE_HDR_SIZE);
	put_le64(h + 16, b->len - STATE_HDR_SIZE);
	put_le32(h + 24, crc32_update(0, h + STATE_HDR_SIZE, b->len - STATE_HDR_SIZE));
	put_le32(h + 28, crc32_update(0, h, 28));
	return 0;
}

int state_parse(const uint8_t *buf, size_t len, struct state_section_ref **out, size_t *n,
		char *err, size_t errlen)
{
	*out = NULL;
	*n = 0;
	if (len < STATE_HDR_SIZE)
		return errmsg(err, errlen, -EINVAL, "state file is truncated (%zu bytes)", len);
	if (memcmp(buf, STATE_MAGIC, 8))
		return errmsg(err, errlen, -EINVAL, "not a cove state file (bad magic)");
	if (get_le32(buf + 28) != crc32_update(0, buf, 28))
		return errmsg(err, errlen, -EINVAL, "state file header is corrupt (CRC mismatch)");
	uint32_t version = get_le32(buf + 8);
	if (version < STATE_MIN_VERSION || version > STATE_VERSION)
		return errmsg(err, errlen, -EINVAL,
			      "state file version %u is not supported (this cove reads %u to %u)",
			      version, STATE_MIN_VERSION, STATE_VERSION);
	if (get_le32(buf + 12) != STATE_HDR_SIZE)
		return errmsg(err, errlen, -EINVAL, "state file header size is wrong");
	uint64_t body = get_le64(buf + 16);
	if (body > STATE_MAX_BODY)
		return errmsg(err, errlen, -EINVAL, "state file body is too large (%llu bytes)",
			      (unsigned long long)body);
	if (body != len - STATE_HDR_SIZE)
		return errmsg(
		    err, errlen, -EINVAL,
		    "state file is truncated or has trailing bytes (%zu of %llu body bytes)",
		    len - STATE_HDR_SIZE, (unsigned long long)body);
	if (get_le32(buf + 24) != crc32_update(0, buf + STATE_HDR_SIZE, (size_t)body))
		return errmsg(err, errlen, -EINVAL, "state file is corrupt (CRC mismatch)");

	size_t cap = 64, cnt = 0;
	struct state_section_ref *s = calloc(cap, sizeof(*s));
	if (!s)
		return -ENOMEM;
	size_t pos = STATE_HDR_SIZE;
	while (pos < len) {
		if (len - pos < SEC_HDR) {
			free(s);
			return errmsg(err, errlen, -EINVAL,
				      "state file: section header past the end");
		}
		uint32_t type = get_le32(buf + pos), inst = get_le32(buf + pos + 4);
		uint32_t slen = get_le32(buf + pos + 8);
		size_t padded = ((size_t)slen + 7) & ~(size_t)7;
		if (slen > STATE_MAX_SECTION || padded > len - pos - SEC_HDR) {
			free(s);
			return errmsg(err, errlen, -EINVAL,
				      "state file: section %u has a bad length %u", type, slen);
		}
		if (type == 0 || type >= SEC_MAX) {
			free(s);
			return errmsg(err, errlen, -EINVAL, "state file: unknown section type %u",
				      type);
		}
		/* A section newer than the file's version is not one its writer could have put. */
		if (type == SEC_VCPU_CPUID && (version < 2 || slen % STATE_CPUID_ENTRY_SIZE ||
					       slen / STATE_CPUID_ENTRY_SIZE > STATE_MAX_CPUID)) {
			free(s);
			return errmsg(err, errlen, -EINVAL,
				      "state file: CPUID of vCPU %u is bad (%u bytes, version %u)",
				      inst, slen, version);
		}
		if (cnt == cap) {
			cap *= 2;
			struct state_section_ref *ns = realloc(s, cap * sizeof(*s));
			if (!ns) {
				free(s);
				return -ENOMEM;
			}
			s = ns;
		}
		s[cnt++] = (struct state_section_ref){type, inst, buf + pos + SEC_HDR, slen};
		pos += SEC_HDR + padded;
	}
	*out = s;
	*n = cnt;
	return 0;
}

const struct state_section_ref *state_find(const struct state_section_ref *s, size_t n,
					   uint32_t type, uint32_t instance)
{
	for (size_t i = 0; i < n; i++)
		if (s[i].type == type && s[i].instance == instance)
			return &s[i];
	return NULL;
}

int state_read_file(const char *path, uint8_t **buf, size_t *len, char *err, size_t errlen)
{
	*buf = NULL;
	*len = 0;
	/* Never through a link: a chain names files inside itself only. */
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errmsg(err, errlen, -errno, "cannot open state file %s: %s", path,
			      strerror(errno));
	struct stat st;
	int r = 0;
	if (fstat(fd, &st) < 0) {
		r = errmsg(err, errlen, -errno, "cannot stat %s: %s", path, strerror(errno));
		goto out;
	}
	if (st.st_size < 0 || (uint64_t)st.st_size > STATE_HDR_SIZE + (uint64_t)STATE_MAX_BODY) {
		r = errmsg(err, errlen, -EFBIG, "state file %s is too large", path);
		goto out;
	}
	uint8_t *p = malloc((size_t)st.st_size + 1);
	if (!p) {
		r = -ENOMEM;
		goto out;
	}
	r = pread_full(fd, p, (size_t)st.st_size, 0);
	if (r) {
		errmsg(err, errlen, r, "cannot read %s: %s", path,
		       r == -EIO ? "short read or I/O error" : strerror(-r));
		free(p);
		goto out;
	}
	*buf = p;
	*len = (size_t)st.st_size;
out:
	close(fd);
	return r;
}
