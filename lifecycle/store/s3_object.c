/* Object operations: PUT (buffer or fd range, optionally create-only), GET (whole or a range,
 * into a buffer or an fd), HEAD, DELETE, and ListObjectsV2 pages. */
#include "lifecycle/store/s3_internal.h"

#include "common/errmsg.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int put_common(struct s3_client *c, struct s3_req *r, const char *key, unsigned flags,
		      char *err, size_t errlen)
{
	char full[S3_KEY_MAX + 1];
	int e = s3_full_key(c, key, full, sizeof(full), err, errlen);
	if (e)
		return e;
	r->method = "PUT";
	r->key = full;
	r->flags = flags & (S3_IF_NONE_MATCH | S3_IF_MATCH);
	return s3_perform(c, r, err, errlen);
}

int s3_put(struct s3_client *c, const char *key, const void *buf, size_t len, unsigned flags,
	   char *err, size_t errlen)
{
	struct s3_req *r = calloc(1, sizeof(*r));
	if (!r)
		return errmsg(err, errlen, -ENOMEM, "s3: out of memory");
	r->body_kind = S3_BODY_BUF;
	r->body = buf;
	r->body_len = len;
	int e = put_common(c, r, key, flags, err, errlen);
	free(r);
	return e;
}

int s3_put_fd(struct s3_client *c, const char *key, int fd, off_t off, uint64_t len, unsigned flags,
	      char *err, size_t errlen)
{
	if (off < 0)
		return errmsg(err, errlen, -EINVAL, "s3 PUT %s: negative offset", key);
	struct s3_req *r = calloc(1, sizeof(*r));
	if (!r)
		return errmsg(err, errlen, -ENOMEM, "s3: out of memory");
	r->body_kind = S3_BODY_FD;
	r->body_fd = fd;
	r->body_off = off;
	r->body_fd_len = len;
	int e = put_common(c, r, key, flags, err, errlen);
	free(r);
	return e;
}

static int get_common(struct s3_client *c, struct s3_req *r, const char *key, uint64_t off,
		      uint64_t len, uint64_t *got, char *err, size_t errlen);

static int get_buf(struct s3_client *c, const char *key, uint64_t off, uint64_t len, void *buf,
		   size_t cap, size_t *got, char *etag_out, char *err, size_t errlen);

/* A bare ETag: the value without its surrounding quotes. */
static void bare_etag(const char *in, char *out)
{
	size_t n = strlen(in);
	if (n >= 2 && in[0] == '"' && in[n - 1] == '"')
		in++, n -= 2;
	memcpy(out, in, n);
	out[n] = '\0';
}

int s3_put_cond(struct s3_client *c, const char *key, const void *buf, size_t len,
		const char *if_match, char *etag_out, char *err, size_t errlen)
{
	if (if_match && (!if_match[0] || strlen(if_match) > S3_ETAG_MAX))
		return errmsg(err, errlen, -EINVAL, "s3 PUT %s: a bad If-Match ETag", key);
	struct s3_req *r = calloc(1, sizeof(*r));
	if (!r)
		return errmsg(err, errlen, -ENOMEM, "s3: out of memory");
	r->body_kind = S3_BODY_BUF;
	r->body = buf;
	r->body_len = len;
	if (if_match)
		bare_etag(if_match, r->if_match);
	int e = put_common(c, r, key, if_match ? S3_IF_MATCH : S3_IF_NONE_MATCH, err, errlen);
	if (!e && etag_out)
		bare_etag(r->etag, etag_out);
	free(r);
	return e;
}

int s3_get_etag(struct s3_client *c, const char *key, void *buf, size_t cap, size_t *got,
		char *etag_out, char *err, size_t errlen)
{
	return get_buf(c, key, 0, 0, buf, cap, got, etag_out, err, errlen);
}

static int get_common(struct s3_client *c, struct s3_req *r, const char *key, uint64_t off,
		      uint64_t len, uint64_t *got, char *err, size_t errlen)
{
	char full[S3_KEY_MAX + 1];
	int e = s3_full_key(c, key, full, sizeof(full), err, errlen);
	if (e)
		return e;
	if (len && off > UINT64_MAX / 4 - len)
		return errmsg(err, errlen, -EINVAL, "s3 GET %s: range out of bounds", key);
	if (!len && off)
		return errmsg(err, errlen, -EINVAL, "s3 GET %s: an offset needs a length", key);
	r->method = "GET";
	r->key = full;
	if (len)
		snprintf(r->range, sizeof(r->range), "bytes=%" PRIu64 "-%" PRIu64, off,
			 off + len - 1);
	e = s3_perform(c, r, err, errlen);
	*got = e ? 0 : r->received;
	return e;
}

/* A GET into a caller buffer, with the reply's ETag (bare) into etag_out when not NULL. */
static int get_buf(struct s3_client *c, const char *key, uint64_t off, uint64_t len, void *buf,
		   size_t cap, size_t *got, char *etag_out, char *err, size_t errlen)
{
	struct s3_req *r = calloc(1, sizeof(*r));
	if (!r)
		return errmsg(err, errlen, -ENOMEM, "s3: out of memory");
	r->sink_kind = S3_SINK_BUF;
	r->out = buf;
	r->out_cap = cap;
	uint64_t g = 0;
	int e = get_common(c, r, key, off, len, &g, err, errlen);
	*got = (size_t)g;
	if (!e && etag_out)
		bare_etag(r->etag, etag_out);
	free(r);
	return e;
}

int s3_get(struct s3_client *c, const char *key, uint64_t off, uint64_t len, void *buf, size_t cap,
	   size_t *got, char *err, size_t errlen)
{
	return get_buf(c, key, off, len, buf, cap, got, NULL, err, errlen);
}

int s3_get_fd(struct s3_client *c, const char *key, uint64_t off, uint64_t len, int fd,
	      off_t fd_off, uint64_t cap, uint64_t *got, char *err, size_t errlen)
{
	if (fd_off < 0)
		return errmsg(err, errlen, -EINVAL, "s3 GET %s: negative file offset", key);
	struct s3_req *r = calloc(1, sizeof(*r));
	if (!r)
		return errmsg(err, errlen, -ENOMEM, "s3: out of memory");
	r->sink_kind = S3_SINK_FD;
	r->out_fd = fd;
	r->out_fd_off = fd_off;
	r->out_fd_cap = cap;
	int e = get_common(c, r, key, off, len, got, err, errlen);
	free(r);
	return e;
}

int s3_head(struct s3_client *c, const char *key, struct s3_object_info *info, char *err,
	    size_t errlen)
{
	char full[S3_KEY_MAX + 1];
	int e = s3_full_key(c, key, full, sizeof(full), err, errlen);
	if (e)
		return e;
	struct s3_req *r = calloc(1, sizeof(*r));
	if (!r)
		return errmsg(err, errlen, -ENOMEM, "s3: out of memory");
	r->method = "HEAD";
	r->key = full;
	e = s3_perform(c, r, err, errlen);
	if (!e && !r->have_cl)
		e = errmsg(err, errlen, -EBADMSG, "s3 HEAD %s: no Content-Length", key);
	if (!e) {
		info->size = r->content_length;
		memcpy(info->etag, r->etag, sizeof(info->etag));
	}
	free(r);
	return e;
}

int s3_delete(struct s3_client *c, const char *key, char *err, size_t errlen)
{
	char full[S3_KEY_MAX + 1];
	int e = s3_full_key(c, key, full, sizeof(full), err, errlen);
	if (e)
		return e;
	struct s3_req *r = calloc(1, sizeof(*r));
	if (!r)
		return errmsg(err, errlen, -ENOMEM, "s3: out of memory");
	r->method = "DELETE";
	r->key = full;
	e = s3_perform(c, r, err, errlen);
	free(r);
	return e == -ENOENT ? 0 : e;
}

void s3_list_page_free(struct s3_list_page *page)
{
	free(page->entries);
	memset(page, 0, sizeof(*page));
}

/* Removes the configured prefix from keys the server listed; a key outside it is refused. */
int s3_strip_prefix(const struct s3_client *c, char *key, char *err, size_t errlen)
{
	size_t pl = strlen(c->cfg.prefix);
	if (strncmp(key, c->cfg.prefix, pl) || !key[pl])
		return errmsg(err, errlen, -EBADMSG,
			      "s3: the store listed key \"%.80s\" outside prefix \"%s\"", key,
			      c->cfg.prefix);
	memmove(key, key + pl, strlen(key + pl) + 1);
	return 0;
}

int s3_list(struct s3_client *c, const char *prefix, const char *token, size_t max_keys,
	    struct s3_list_page *page, char *err, size_t errlen)
{
	memset(page, 0, sizeof(*page));
	if (!max_keys || max_keys > S3_LIST_MAX)
		return errmsg(err, errlen, -EINVAL, "s3 list: max_keys must be 1-%d", S3_LIST_MAX);
	char full[S3_KEY_MAX + 1], enc_prefix[3 * S3_KEY_MAX + 1], enc_tok[3 * S3_KEY_MAX + 1] = "";
	size_t pl = strlen(c->cfg.prefix);
	if (pl + strlen(prefix) > S3_KEY_MAX)
		return errmsg(err, errlen, -ENAMETOOLONG, "s3 list: prefix too long");
	memcpy(full, c->cfg.prefix, pl);
	strcpy(full + pl, prefix);
	if (s3_uri_encode(full, false, enc_prefix, sizeof(enc_prefix)) ||
	    (token && s3_uri_encode(token, false, enc_tok, sizeof(enc_tok))))
		return errmsg(err, errlen, -ENAMETOOLONG, "s3 list: prefix or token too long");
	/* canonical order: continuation-token, list-type, max-keys, prefix */
	char *query = malloc(S3_URL_MAX);
	struct s3_req *r = calloc(1, sizeof(*r));
	char *body = malloc(S3_REPLY_MAX);
	int e = -ENOMEM;
	if (!query || !r || !body) {
		errmsg(err, errlen, e, "s3: out of memory");
		goto out;
	}
	int n = snprintf(query, S3_URL_MAX, "%s%s%slist-type=2&max-keys=%zu&prefix=%s",
			 enc_tok[0] ? "continuation-token=" : "", enc_tok, enc_tok[0] ? "&" : "",
			 max_keys, enc_prefix);
	if (n < 0 || n >= S3_URL_MAX) {
		e = errmsg(err, errlen, -ENAMETOOLONG, "s3 list: query too long");
		goto out;
	}
	r->method = "GET";
	r->query = query;
	r->sink_kind = S3_SINK_BUF;
	r->out = body;
	r->out_cap = S3_REPLY_MAX;
	e = s3_perform(c, r, err, errlen);
	if (e)
		goto out;
	e = s3_xml_list_objects(body, r->received, max_keys, page, err, errlen);
	for (size_t i = 0; !e && i < page->n; i++)
		e = s3_strip_prefix(c, page->entries[i].key, err, errlen);
	if (e)
		s3_list_page_free(page);
out:
	free(query);
	free(r);
	free(body);
	return e;
}
