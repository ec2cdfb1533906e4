/* S3's XML replies, parsed with libxml2: size-capped, no network, no entity expansion, every
 * field length- and range-checked. Pure functions over a buffer (fuzzable). */
#include "lifecycle/store/s3_internal.h"

#include "common/errmsg.h"

#include <errno.h>
#include <libxml/parser.h>
#include <libxml/tree.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static xmlDocPtr parse(const char *body, size_t len)
{
	if (!len || len > S3_REPLY_MAX)
		return NULL;
	/* no XML_PARSE_NOENT (no entity substitution), no DTD loading, no network */
	return xmlReadMemory(body, (int)len, "s3.xml", NULL,
			     XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING |
				 XML_PARSE_NOBLANKS);
}

static bool named(xmlNodePtr n, const char *name)
{
	return n->type == XML_ELEMENT_NODE && !strcmp((const char *)n->name, name);
}

static xmlNodePtr child(xmlNodePtr parent, const char *name)
{
	for (xmlNodePtr n = parent->children; n; n = n->next)
		if (named(n, name))
			return n;
	return NULL;
}

/* The text of an element, at most max bytes, printable or (keys) any byte but controls. */
static int text_of(xmlNodePtr n, char *out, size_t max, bool allow_empty)
{
	xmlChar *t = xmlNodeGetContent(n);
	if (!t)
		return -EBADMSG;
	size_t l = strlen((const char *)t);
	int e = 0;
	if (l > max || (!l && !allow_empty))
		e = -EBADMSG;
	for (size_t i = 0; !e && i < l; i++)
		if (t[i] < 0x20 || t[i] == 0x7f)
			e = -EBADMSG;
	if (!e)
		memcpy(out, t, l + 1);
	xmlFree(t);
	return e;
}

static int child_text(xmlNodePtr parent, const char *name, char *out, size_t max, bool allow_empty)
{
	xmlNodePtr n = child(parent, name);
	return n ? text_of(n, out, max, allow_empty) : -ENOENT;
}

static int child_u64(xmlNodePtr parent, const char *name, uint64_t *v)
{
	char buf[24];
	int e = child_text(parent, name, buf, 20, false);
	if (e)
		return e;
	uint64_t x = 0;
	for (const char *p = buf; *p; p++) {
		if (*p < '0' || *p > '9' || x > (UINT64_MAX / 2 - 9) / 10)
			return -EBADMSG;
		x = x * 10 + (uint64_t)(*p - '0');
	}
	*v = x;
	return 0;
}

static int child_bool(xmlNodePtr parent, const char *name, bool *v)
{
	char buf[8];
	int e = child_text(parent, name, buf, 5, false);
	if (e == -ENOENT) {
		*v = false;
		return 0;
	}
	if (e)
		return e;
	if (!strcmp(buf, "true"))
		*v = true;
	else if (!strcmp(buf, "false"))
		*v = false;
	else
		return -EBADMSG;
	return 0;
}

int s3_xml_error_code(const char *body, size_t len, char *code, size_t codelen)
{
	code[0] = '\0';
	xmlDocPtr d = parse(body, len);
	if (!d)
		return -EBADMSG;
	xmlNodePtr root = xmlDocGetRootElement(d);
	int e = root && named(root, "Error") ? child_text(root, "Code", code, codelen - 1, false)
					     : -EBADMSG;
	if (e)
		code[0] = '\0';
	xmlFreeDoc(d);
	return e;
}

int s3_xml_upload_id(const char *body, size_t len, char *id, size_t idlen, char *err, size_t errlen)
{
	xmlDocPtr d = parse(body, len);
	xmlNodePtr root = d ? xmlDocGetRootElement(d) : NULL;
	int e = root && named(root, "InitiateMultipartUploadResult")
		    ? child_text(root, "UploadId", id, idlen - 1, false)
		    : -EBADMSG;
	/* the id goes back into URLs: printable only */
	for (const char *p = id; !e && *p; p++)
		if ((unsigned char)*p <= 0x20 || *p == 0x7f)
			e = -EBADMSG;
	if (d)
		xmlFreeDoc(d);
	return e ? errmsg(err, errlen, -EBADMSG,
			  "s3: the reply to CreateMultipartUpload has no valid UploadId")
		 : 0;
}

int s3_xml_complete(const char *body, size_t len, bool *retry, char *err, size_t errlen)
{
	*retry = false;
	xmlDocPtr d = parse(body, len);
	xmlNodePtr root = d ? xmlDocGetRootElement(d) : NULL;
	int e = 0;
	if (!root) {
		e = errmsg(err, errlen, -EBADMSG,
			   "s3: the reply to CompleteMultipartUpload is not XML");
	} else if (named(root, "Error")) {
		char code[64] = "";
		child_text(root, "Code", code, sizeof(code) - 1, false);
		*retry = !strcmp(code, "InternalError") || !strcmp(code, "SlowDown") ||
			 !strcmp(code, "ServiceUnavailable");
		e = errmsg(err, errlen, -EIO, "s3: CompleteMultipartUpload failed: %s",
			   code[0] ? code : "(no code)");
	} else if (!named(root, "CompleteMultipartUploadResult")) {
		e = errmsg(err, errlen, -EBADMSG,
			   "s3: unexpected reply to CompleteMultipartUpload: <%.40s>", root->name);
	}
	/* Ceph answers <ETag></ETag> here: the ETag is not checked */
	if (d)
		xmlFreeDoc(d);
	return e;
}

int s3_xml_list_objects(const char *body, size_t len, size_t max, struct s3_list_page *page,
			char *err, size_t errlen)
{
	memset(page, 0, sizeof(*page));
	xmlDocPtr d = parse(body, len);
	xmlNodePtr root = d ? xmlDocGetRootElement(d) : NULL;
	int e = 0;
	if (!root || !named(root, "ListBucketResult")) {
		e = errmsg(err, errlen, -EBADMSG, "s3 list: the reply is not a ListBucketResult");
		goto out;
	}
	size_t count = 0;
	for (xmlNodePtr n = root->children; n; n = n->next)
		count += named(n, "Contents");
	if (count > max) {
		e = errmsg(err, errlen, -EBADMSG, "s3 list: %zu keys in a page of at most %zu",
			   count, max);
		goto out;
	}
	page->entries = calloc(count ? count : 1, sizeof(*page->entries));
	if (!page->entries) {
		e = errmsg(err, errlen, -ENOMEM, "s3: out of memory");
		goto out;
	}
	for (xmlNodePtr n = root->children; n; n = n->next) {
		if (!named(n, "Contents"))
			continue;
		struct s3_list_entry *en = &page->entries[page->n];
		if (child_text(n, "Key", en->key, S3_KEY_MAX, false) ||
		    child_u64(n, "Size", &en->size)) {
			e = errmsg(err, errlen, -EBADMSG,
				   "s3 list: entry %zu has no valid Key or Size", page->n);
			goto out;
		}
		char lm[40];
		struct tm tm = {0};
		const char *end;
		/* "2026-12-04T15:00:00.000Z": seconds are enough (gc's grace period). */
		if (!child_text(n, "LastModified", lm, sizeof(lm) - 1, false) &&
		    (end = strptime(lm, "%Y-%m-%dT%H:%M:%S", &tm)) && (*end == '.' || *end == 'Z'))
			en->mtime = (int64_t)timegm(&tm);
		int te = child_text(n, "ETag", en->etag, S3_ETAG_MAX, true);
		if (te && te != -ENOENT) {
			e = errmsg(err, errlen, -EBADMSG, "s3 list: entry %zu has a bad ETag",
				   page->n);
			goto out;
		}
		page->n++;
	}
	if (child_bool(root, "IsTruncated", &page->truncated)) {
		e = errmsg(err, errlen, -EBADMSG, "s3 list: bad IsTruncated");
		goto out;
	}
	if (page->truncated &&
	    child_text(root, "NextContinuationToken", page->next_token, S3_KEY_MAX, false)) {
		e = errmsg(err, errlen, -EBADMSG,
			   "s3 list: a truncated page without a valid NextContinuationToken");
		goto out;
	}
out:
	if (e)
		s3_list_page_free(page);
	if (d)
		xmlFreeDoc(d);
	return e;
}

int s3_xml_list_uploads(const char *body, size_t len, size_t max, struct s3_upload_entry *out,
			size_t *n, bool *truncated, char *next_key, char *next_id, char *err,
			size_t errlen)
{
	xmlDocPtr d = parse(body, len);
	xmlNodePtr root = d ? xmlDocGetRootElement(d) : NULL;
	int e = 0;
	*truncated = false;
	if (!root || !named(root, "ListMultipartUploadsResult")) {
		e = errmsg(err, errlen, -EBADMSG,
			   "s3 list uploads: the reply is not a ListMultipartUploadsResult");
		goto out;
	}
	for (xmlNodePtr u = root->children; u; u = u->next) {
		if (!named(u, "Upload"))
			continue;
		if (*n >= max) {
			e = errmsg(err, errlen, -E2BIG, "s3 list uploads: more than %zu uploads",
				   max);
			goto out;
		}
		if (child_text(u, "Key", out[*n].key, S3_KEY_MAX, false) ||
		    child_text(u, "UploadId", out[*n].upload_id, S3_UPLOAD_ID_MAX, false)) {
			e = errmsg(err, errlen, -EBADMSG,
				   "s3 list uploads: an Upload without a valid Key or UploadId");
			goto out;
		}
		(*n)++;
	}
	if (child_bool(root, "IsTruncated", truncated)) {
		e = errmsg(err, errlen, -EBADMSG, "s3 list uploads: bad IsTruncated");
		goto out;
	}
	if (*truncated &&
	    (child_text(root, "NextKeyMarker", next_key, S3_KEY_MAX, false) ||
	     child_text(root, "NextUploadIdMarker", next_id, S3_UPLOAD_ID_MAX, false))) {
		e = errmsg(err, errlen, -EBADMSG,
			   "s3 list uploads: a truncated page without valid next markers");
		goto out;
	}
out:
	if (d)
		xmlFreeDoc(d);
	return e;
}
