/* Multipart uploads: create, complete, abort, list; and a whole upload from an fd with its
 * parts in flight in parallel over one curl multi handle, each part retried on its own. */
#include "lifecycle/store/s3_internal.h"

#include "common/errmsg.h"
#include "common/log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MPU_REPLY_MAX 65536

static int upload_query(const char *upload_id, int part, char *q, size_t qlen)
{
	char enc[3 * S3_UPLOAD_ID_MAX + 1];
	if (s3_uri_encode(upload_id, false, enc, sizeof(enc)))
		return -ENAMETOOLONG;
	int n = part ? snprintf(q, qlen, "partNumber=%d&uploadId=%s", part, enc)
		     : snprintf(q, qlen, "uploadId=%s", enc);
	return n < 0 || (size_t)n >= qlen ? -ENAMETOOLONG : 0;
}

int s3_mpu_create(struct s3_client *c, const char *key, char *upload_id, size_t idlen, char *err,
		  size_t errlen)
{
	char full[S3_KEY_MAX + 1];
	int e = s3_full_key(c, key, full, sizeof(full), err, errlen);
	if (e)
		return e;
	struct s3_req *r = calloc(1, sizeof(*r));
	char *body = malloc(MPU_REPLY_MAX);
	if (!r || !body) {
		e = errmsg(err, errlen, -ENOMEM, "s3: out of memory");
		goto out;
	}
	r->method = "POST";
	r->key = full;
	r->query = "uploads=";
	r->body_kind = S3_BODY_BUF; /* an empty body: POST without curl's form defaults */
	r->body = "";
	r->sink_kind = S3_SINK_BUF;
	r->out = body;
	r->out_cap = MPU_REPLY_MAX;
	e = s3_perform(c, r, err, errlen);
	if (!e)
		e = s3_xml_upload_id(body, r->received, upload_id, idlen, err, errlen);
out:
	free(r);
	free(body);
	return e;
}

int s3_mpu_complete(struct s3_client *c, const char *key, const char *upload_id,
		    const struct s3_part *parts, size_t n, char *err, size_t errlen)
{
	char full[S3_KEY_MAX + 1], q[3 * S3_UPLOAD_ID_MAX + 32];
	int e = s3_full_key(c, key, full, sizeof(full), err, errlen);
	if (e)
		return e;
	if (!n || n > S3_PARTS_MAX)
		return errmsg(err, errlen, -EINVAL, "s3: a multipart upload has 1-%d parts",
			      S3_PARTS_MAX);
	if (upload_query(upload_id, 0, q, sizeof(q)))
		return errmsg(err, errlen, -ENAMETOOLONG, "s3: upload id too long");
	size_t cap = 64 + n * (S3_ETAG_MAX + 64);
	char *xml = malloc(cap);
	char *body = malloc(MPU_REPLY_MAX);
	struct s3_req *r = calloc(1, sizeof(*r));
	if (!xml || !body || !r) {
		e = errmsg(err, errlen, -ENOMEM, "s3: out of memory");
		goto out;
	}
	size_t o = (size_t)snprintf(xml, cap, "<CompleteMultipartUpload>");
	for (size_t i = 0; i < n; i++)
		o += (size_t)snprintf(xml + o, cap - o,
				      "<Part><PartNumber>%d</PartNumber><ETag>%s</ETag></Part>",
				      parts[i].number, parts[i].etag);
	o += (size_t)snprintf(xml + o, cap - o, "</CompleteMultipartUpload>");
	r->method = "POST";
	r->key = full;
	r->query = q;
	r->body_kind = S3_BODY_BUF;
	r->body = xml;
	r->body_len = o;
	r->sink_kind = S3_SINK_BUF;
	r->out = body;
	r->out_cap = MPU_REPLY_MAX;
	for (int attempt = 1;; attempt++) {
		e = s3_perform(c, r, err, errlen);
		if (e)
			break;
		/* a 200 may still carry an <Error> (the server failed while it answered) */
		bool retry;
		e = s3_xml_complete(body, r->received, &retry, err, errlen);
		if (!e || !retry || attempt >= c->opts.max_attempts)
			break;
		c->retries++;
		s3_sleep_ms(s3_backoff_ms((unsigned)attempt, c->opts.base_delay_ms,
					  c->opts.max_delay_ms, &c->rng));
	}
out:
	free(xml);
	free(body);
	free(r);
	return e;
}

int s3_mpu_abort(struct s3_client *c, const char *key, const char *upload_id, char *err,
		 size_t errlen)
{
	char full[S3_KEY_MAX + 1], q[3 * S3_UPLOAD_ID_MAX + 32];
	int e = s3_full_key(c, key, full, sizeof(full), err, errlen);
	if (e)
		return e;
	if (upload_query(upload_id, 0, q, sizeof(q)))
		return errmsg(err, errlen, -ENAMETOOLONG, "s3: upload id too long");
	struct s3_req *r = calloc(1, sizeof(*r));
	if (!r)
		return errmsg(err, errlen, -ENOMEM, "s3: out of memory");
	r->method = "DELETE";
	r->key = full;
	r->query = q;
	e = s3_perform(c, r, err, errlen);
	free(r);
	return e;
}

int s3_list_uploads(struct s3_client *c, const char *prefix, size_t max,
		    struct s3_upload_entry **out, size_t *n, char *err, size_t errlen)
{
	*out = NULL;
	*n = 0;
	char full[S3_KEY_MAX + 1], enc_prefix[3 * S3_KEY_MAX + 1];
	size_t pl = strlen(c->cfg.prefix);
	if (pl + strlen(prefix) > S3_KEY_MAX || !max || max > 100000)
		return errmsg(err, errlen, -EINVAL, "s3 list uploads: bad prefix or count");
	memcpy(full, c->cfg.prefix, pl);
	strcpy(full + pl, prefix);
	if (s3_uri_encode(full, false, enc_prefix, sizeof(enc_prefix)))
		return errmsg(err, errlen, -ENAMETOOLONG, "s3 list uploads: prefix too long");
	struct s3_upload_entry *ents = calloc(max, sizeof(*ents));
	char *body = malloc(S3_REPLY_MAX), *query = malloc(S3_URL_MAX);
	char *key_marker = calloc(1, S3_KEY_MAX + 1), *id_marker = calloc(1, S3_UPLOAD_ID_MAX + 1);
	char *ek = malloc(3 * S3_KEY_MAX + 1), *ei = malloc(3 * S3_UPLOAD_ID_MAX + 1);
	struct s3_req *r = malloc(sizeof(*r));
	int e = 0;
	if (!ents || !body || !query || !key_marker || !id_marker || !ek || !ei || !r) {
		e = errmsg(err, errlen, -ENOMEM, "s3: out of memory");
		goto out;
	}
	for (int page = 0;; page++) {
		if (s3_uri_encode(key_marker, false, ek, 3 * S3_KEY_MAX + 1) ||
		    s3_uri_encode(id_marker, false, ei, 3 * S3_UPLOAD_ID_MAX + 1)) {
			e = errmsg(err, errlen, -EBADMSG, "s3 list uploads: markers too long");
			goto out;
		}
		snprintf(query, S3_URL_MAX, "%s%s%smax-uploads=1000&prefix=%s&%s%s%suploads=",
			 ek[0] ? "key-marker=" : "", ek, ek[0] ? "&" : "", enc_prefix,
			 ei[0] ? "upload-id-marker=" : "", ei, ei[0] ? "&" : "");
		memset(r, 0, sizeof(*r));
		r->method = "GET";
		r->query = query;
		r->sink_kind = S3_SINK_BUF;
		r->out = body;
		r->out_cap = S3_REPLY_MAX;
		e = s3_perform(c, r, err, errlen);
		if (e)
			goto out;
		size_t before = *n;
		bool truncated;
		e = s3_xml_list_uploads(body, r->received, max, ents, n, &truncated, key_marker,
					id_marker, err, errlen);
		for (size_t i = before; !e && i < *n; i++)
			e = s3_strip_prefix(c, ents[i].key, err, errlen);
		if (e)
			goto out;
		if (!truncated)
			break;
		if (*n == before || page > 1000) {
			e = errmsg(err, errlen, -EBADMSG,
				   "s3 list uploads: a truncated page that lists nothing");
			goto out;
		}
	}
out:
	if (e) {
		free(ents);
		ents = NULL;
		*n = 0;
	}
	*out = ents;
	free(body);
	free(query);
	free(key_marker);
	free(id_marker);
	free(ek);
	free(ei);
	free(r);
	return e;
}

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

enum part_state { PART_TODO = 0, PART_BUSY, PART_DONE };
struct part_track {
	enum part_state state;
	unsigned attempt; /* attempts made */
	uint64_t due_ms;
};
struct slot {
	struct s3_req req;
	CURL *h;
	int part; /* 0: free */
	char full[S3_KEY_MAX + 1];
	char query[3 * S3_UPLOAD_ID_MAX + 64];
};

struct upload {
	struct s3_client *c;
	const char *key;
	const char *upload_id;
	int fd;
	off_t off;
	uint64_t len;
	size_t nparts;
	struct s3_part *parts;
	struct part_track *track;
	struct slot *slots;
	int nslots;
	CURLM *m;
	const struct s3_upload_hooks *hooks;
	uint64_t bytes_read;
};

static void upload_on_read(void *arg, size_t n)
{
	struct upload *u = arg;
	u->bytes_read += n;
	if (u->hooks && u->hooks->bytes_read)
		u->hooks->bytes_read(u->hooks->arg, u->bytes_read);
}

static int part_start(struct upload *u, struct slot *s, int part, char *err, size_t errlen)
{
	struct s3_client *c = u->c;
	uint64_t psz = c->opts.part_size, start = (uint64_t)(part - 1) * psz;
	memset(&s->req, 0, sizeof(s->req));
	if (s3_full_key(c, u->key, s->full, sizeof(s->full), err, errlen) ||
	    upload_query(u->upload_id, part, s->query, sizeof(s->query)))
		return errmsg(err, errlen, -ENAMETOOLONG, "s3: key or upload id too long");
	s->req.method = "PUT";
	s->req.key = s->full;
	s->req.query = s->query;
	s->req.body_kind = S3_BODY_FD;
	s->req.body_fd = u->fd;
	s->req.body_off = u->off + (off_t)start;
	s->req.body_fd_len = u->len - start < psz ? u->len - start : psz;
	s->req.on_read = upload_on_read;
	s->req.on_read_arg = u;
	curl_easy_reset(s->h);
	int e = s3_req_setup(c, &s->req, s->h, err, errlen);
	if (e)
		return e;
	if (curl_multi_add_handle(u->m, s->h) != CURLM_OK) {
		curl_slist_free_all(s->req.headers);
		s->req.headers = NULL;
		return errmsg(err, errlen, -ENOMEM, "s3: curl_multi_add_handle failed");
	}
	s->part = part;
	u->track[part - 1].state = PART_BUSY;
	u->track[part - 1].attempt++;
	return 0;
}

/* One finished transfer: the part stored, scheduled again after a backoff, or the end. */
static int part_finish(struct upload *u, struct slot *s, CURLcode cc,
		       const struct s3_upload_hooks *hooks, size_t *done, char *err, size_t errlen)
{
	struct s3_client *c = u->c;
	int part = s->part;
	struct part_track *t = &u->track[part - 1];
	bool retry;
	curl_multi_remove_handle(u->m, s->h);
	s->part = 0;
	int e = s3_req_finish(c, &s->req, cc, &retry, err, errlen);
	if (!e && !s->req.etag[0])
		e = errmsg(err, errlen, -EBADMSG, "s3 PUT %s part %d: stored without an ETag",
			   u->key, part);
	if (!e) {
		t->state = PART_DONE;
		u->parts[part - 1].number = part;
		memcpy(u->parts[part - 1].etag, s->req.etag, sizeof(s->req.etag));
		(*done)++;
		if (hooks && hooks->part_done)
			hooks->part_done(hooks->arg, part);
		return 0;
	}
	if (!retry || t->attempt >= (unsigned)c->opts.max_attempts) {
		char first[400];
		snprintf(first, sizeof(first), "%s", err);
		return errmsg(err, errlen, e, "%s (part %d, gave up after %u attempts)", first,
			      part, t->attempt);
	}
	unsigned ms =
	    s3_backoff_ms(t->attempt, c->opts.base_delay_ms, c->opts.max_delay_ms, &c->rng);
	if (c->opts.log)
		log_warn(c->opts.log, "%s (part %d); retry %u/%d in %u ms", err, part, t->attempt,
			 c->opts.max_attempts - 1, ms);
	c->retries++;
	t->state = PART_TODO;
	t->due_ms = now_ms() + ms;
	return 0;
}

static int upload_parts(struct upload *u, const struct s3_upload_hooks *hooks, char *err,
			size_t errlen)
{
	size_t done = 0;
	int e = 0;
	while (done < u->nparts && !e) {
		uint64_t now = now_ms(), next_due = UINT64_MAX;
		int busy = 0;
		size_t scan = 0;
		for (int i = 0; i < u->nslots && !e; i++) {
			if (u->slots[i].part) {
				busy++;
				continue;
			}
			for (; scan < u->nparts; scan++) {
				struct part_track *t = &u->track[scan];
				if (t->state != PART_TODO)
					continue;
				if (t->due_ms > now) {
					if (t->due_ms < next_due)
						next_due = t->due_ms;
					continue;
				}
				e = part_start(u, &u->slots[i], (int)scan + 1, err, errlen);
				busy++;
				scan++;
				break;
			}
		}
		if (e)
			break;
		int running;
		if (curl_multi_perform(u->m, &running) != CURLM_OK) {
			e = errmsg(err, errlen, -EIO, "s3: curl_multi_perform failed");
			break;
		}
		CURLMsg *msg;
		int left, finished = 0;
		while (!e && (msg = curl_multi_info_read(u->m, &left))) {
			if (msg->msg != CURLMSG_DONE)
				continue;
			struct s3_req *req;
			curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&req);
			struct slot *s = (struct slot *)((char *)req - offsetof(struct slot, req));
			e = part_finish(u, s, msg->data.result, hooks, &done, err, errlen);
			finished++;
		}
		if (e || done == u->nparts)
			break;
		if (finished)
			continue; /* slots came free: fill them before waiting */
		long wait = 1000;
		if (!busy && next_due != UINT64_MAX)
			wait = next_due > now ? (long)(next_due - now) : 0;
		else if (next_due != UINT64_MAX && next_due - now < 1000)
			wait = next_due > now ? (long)(next_due - now) : 0;
		curl_multi_poll(u->m, NULL, 0, (int)wait, NULL);
	}
	/* on failure: take the parts still in flight off the multi handle */
	for (int i = 0; i < u->nslots; i++) {
		if (u->slots[i].part) {
			curl_multi_remove_handle(u->m, u->slots[i].h);
			curl_slist_free_all(u->slots[i].req.headers);
			u->slots[i].req.headers = NULL;
			u->slots[i].part = 0;
		}
	}
	return e;
}

int s3_upload_fd(struct s3_client *c, const char *key, int fd, off_t off, uint64_t len,
		 const struct s3_upload_hooks *hooks, char *err, size_t errlen)
{
	uint64_t psz = c->opts.part_size;
	if (off < 0 || !len)
		return errmsg(err, errlen, -EINVAL, "s3 upload %s: empty or negative range", key);
	if ((len + psz - 1) / psz > S3_PARTS_MAX)
		return errmsg(err, errlen, -EFBIG,
			      "s3 upload %s: more than %d parts of %" PRIu64 " bytes", key,
			      S3_PARTS_MAX, psz);
	struct upload u = {.c = c, .key = key, .fd = fd, .off = off, .len = len, .hooks = hooks};
	u.nparts = (size_t)((len + psz - 1) / psz);
	u.nslots = c->opts.parallel < (int)u.nparts ? c->opts.parallel : (int)u.nparts;
	char *upload_id = malloc(S3_UPLOAD_ID_MAX + 1);
	u.parts = calloc(u.nparts, sizeof(*u.parts));
	u.track = calloc(u.nparts, sizeof(*u.track));
	u.slots = calloc((size_t)u.nslots, sizeof(*u.slots));
	u.m = curl_multi_init();
	int e = 0;
	bool created = false;
	if (!upload_id || !u.parts || !u.track || !u.slots || !u.m) {
		e = errmsg(err, errlen, -ENOMEM, "s3: out of memory");
		goto out;
	}
	for (int i = 0; i < u.nslots; i++)
		if (!(u.slots[i].h = curl_easy_init())) {
			e = errmsg(err, errlen, -ENOMEM, "s3: curl_easy_init failed");
			goto out;
		}
	e = s3_mpu_create(c, key, upload_id, S3_UPLOAD_ID_MAX + 1, err, errlen);
	if (e)
		goto out;
	created = true;
	u.upload_id = upload_id;
	e = upload_parts(&u, hooks, err, errlen);
	if (!e) {
		e = s3_mpu_complete(c, key, upload_id, u.parts, u.nparts, err, errlen);
		/* a complete whose reply was lost, retried: the upload is gone, the object there */
		if (e == -ENOENT) {
			struct s3_object_info info;
			char e2[256];
			if (!s3_head(c, key, &info, e2, sizeof(e2)) && info.size == len)
				e = 0;
		}
		if (!e)
			created = false;
	}
out:
	if (created) {
		char abort_err[300];
		int ae = s3_mpu_abort(c, key, upload_id, abort_err, sizeof(abort_err));
		if (ae && ae != -ENOENT) {
			char first[400];
			snprintf(first, sizeof(first), "%s", err);
			errmsg(err, errlen, e, "%s; and the abort failed too: %s", first,
			       abort_err);
		}
	}
	for (int i = 0; u.slots && i < u.nslots; i++)
		if (u.slots[i].h)
			curl_easy_cleanup(u.slots[i].h);
	if (u.m)
		curl_multi_cleanup(u.m);
	free(u.slots);
	free(u.track);
	free(u.parts);
	free(upload_id);
	return e;
}
