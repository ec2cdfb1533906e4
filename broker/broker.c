/* The request pipeline: parse, epoch, policy, destination, helper, libcurl, scrub, audit, reply.
 * The secret lives only on this stack frame and in wiped buffers for the request's duration. */
#include "broker.h"
#include "common/base64.h"
#include "common/clock.h"
#include "dest.h"
#include "common/errmsg.h"
#include "common/hex.h"
#include "fetch.h"
#include "frame.h"
#include "helper.h"
#include "scrub.h"
#include "url.h"

#include <errno.h>
#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define INJECT_MAX 8192

int64_t broker_now_ns(void)
{
	return (int64_t)mono_ns();
}

static int dump_reply(json_t *o, char **reply, size_t *rlen)
{
	char *s;

	if (!o)
		return -ENOMEM;
	s = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	if (!s)
		return -ENOMEM;
	*reply = s;
	*rlen = strlen(s);
	return 0;
}

static int error_reply(const char *prefix, const char *reason, char **reply, size_t *rlen)
{
	char msg[600];

	snprintf(msg, sizeof(msg), "%s%s", prefix, reason);
	return dump_reply(json_pack("{sbss}", "ok", 0, "error", msg), reply, rlen);
}

static void audit_write(struct broker *b, const struct breq *q, const char *url,
			const char *decision, const char *reason, int status)
{
	struct audit_rec rec = {
	    .epoch = q && q->has_token ? q->epoch : b->epoch,
	    .credential = q ? q->credential : "",
	    .method = q ? q->method : "",
	    .url = url ? url : (q ? q->url : ""),
	    .decision = decision,
	    .reason = reason,
	    .status = status,
	};
	int r = audit_append(&b->audit, &rec);

	if (r)
		broker_log(b, LOG_ERROR, "audit append failed: %s", strerror(-r));
	broker_log(b, strcmp(decision, "allow") ? LOG_INFO : LOG_DEBUG, "%s %s %s %s: %s (%d)",
		   decision, rec.credential, rec.method, rec.url, reason, status);
}

static int deny(struct broker *b, const struct breq *q, const char *reason, char **reply,
		size_t *rlen)
{
	audit_write(b, q, NULL, "deny", reason, 0);
	return error_reply("denied: ", reason, reply, rlen);
}

int broker_reject_frame(struct broker *b, const char *why, char **reply, size_t *rlen)
{
	char reason[300];

	snprintf(reason, sizeof(reason), "malformed request: %s", why);
	return deny(b, NULL, reason, reply, rlen);
}

/* Fills the template: "{password}" and "{username}" replaced. Returns 0 or -E2BIG. */
static int fill_template(const char *header, const char *tpl, const struct secret *s, char *out,
			 size_t cap)
{
	size_t o, n;
	const char *t;

	n = strlen(header);
	if (n + 2 >= cap)
		return -E2BIG;
	memcpy(out, header, n);
	memcpy(out + n, ": ", 2);
	o = n + 2;
	for (t = tpl; *t;) {
		const char *v = NULL;

		if (!strncmp(t, "{password}", 10))
			v = s->password;
		else if (!strncmp(t, "{username}", 10))
			v = s->username;
		if (v) {
			n = strlen(v);
			if (o + n >= cap)
				return -E2BIG;
			memcpy(out + o, v, n);
			o += n;
			t += 10;
		} else {
			if (o + 1 >= cap)
				return -E2BIG;
			out[o++] = *t++;
		}
	}
	out[o] = '\0';
	return 0;
}

/* Scrubs the response into the reply object. Returns 0 or -ENOMEM. */
static int build_ok_reply(const struct scrubber *sc, const struct fetch_resp *resp, char **reply,
			  size_t *rlen)
{
	json_t *o = json_object(), *hs = json_array();
	char *clean = NULL, *enc = NULL;
	size_t i, cl;
	int r = -ENOMEM;

	if (!o || !hs)
		goto out;
	for (i = 0; i < resp->nheaders; i++) {
		clean = scrub_apply(sc, resp->headers[i], strlen(resp->headers[i]), &cl);
		if (!clean)
			goto out;
		/* Header bytes may not be UTF-8: keep printable ASCII only. */
		for (size_t k = 0; k < cl; k++)
			if ((unsigned char)clean[k] < 0x20 || (unsigned char)clean[k] > 0x7e)
				clean[k] = clean[k] == '\t' ? '\t' : '?';
		if (json_array_append_new(hs, json_stringn(clean, cl)))
			goto out;
		free(clean);
		clean = NULL;
	}
	clean = scrub_apply(sc, resp->body ? resp->body : "", resp->body_len, &cl);
	if (!clean)
		goto out;
	enc = malloc(b64_enc_len(cl) + 1);
	if (!enc)
		goto out;
	b64_encode((const uint8_t *)clean, cl, enc);
	if (json_object_set_new(o, "ok", json_true()) ||
	    json_object_set_new(o, "status", json_integer(resp->status)) ||
	    json_object_set(o, "headers", hs) ||
	    json_object_set_new(o, "body_b64", json_string(enc)))
		goto out;
	r = dump_reply(json_incref(o), reply, rlen);
out:
	free(clean);
	free(enc);
	json_decref(hs);
	json_decref(o);
	return r;
}

struct broker_job {
	enum job_state state;
	struct breq q;
	struct url_parts u;
	struct cred_policy *c;
	struct helper_proc hp;
	int read_done;
	char pin[1024];
	struct scrubber sc;
	struct fetch f;
	void *owner;
};

static void job_free(struct broker_job *j)
{
	helper_abort(&j->hp);
	if (j->f.easy)
		fetch_end(&j->f, CURLE_ABORTED_BY_CALLBACK, NULL, 0);
	fetch_resp_free(&j->f.resp);
	scrub_free(&j->sc);
	url_parts_free(&j->u);
	breq_free(&j->q);
	free(j);
}

void *broker_job_easy(struct broker_job *j)
{
	return j->f.easy;
}

void **broker_job_owner(struct broker_job *j)
{
	return &j->owner;
}

/* Everything up to the upstream transfer: checks, helper, header, scrubber, easy handle. */
int broker_guest_begin(struct broker *b, const uint8_t *msg, size_t len, char **reply, size_t *rlen,
		       struct broker_job **jobp)
{
	struct broker_job *j = calloc(1, sizeof(*j));
	struct cred_policy *c;
	char err[256], reason[300];
	const char *why;
	int64_t now = broker_now_ns();
	size_t i;
	int r, stale;

	*jobp = NULL;
	*reply = NULL;
	if (!j)
		return -ENOMEM;
	j->hp.pid = -1;
	j->hp.out_fd = -1;
	if (breq_parse(msg, len, &j->q, err, sizeof(err))) {
		snprintf(reason, sizeof(reason), "malformed request: %s", err);
		r = deny(b, &j->q, reason, reply, rlen);
		goto done;
	}
	pthread_mutex_lock(&b->lock);
	stale = !j->q.has_token || !b->have_token || j->q.epoch != b->epoch ||
		CRYPTO_memcmp(j->q.token, b->token, REQ_TOKEN_BYTES);
	pthread_mutex_unlock(&b->lock);
	if (stale) {
		r = deny(b, &j->q, "stale epoch", reply, rlen);
		goto done;
	}
	c = policy_find(&b->pol, j->q.credential);
	if (!c) {
		r = deny(b, &j->q, "unknown credential", reply, rlen);
		goto done;
	}
	if (url_split(j->q.url, &j->u, err, sizeof(err))) {
		snprintf(reason, sizeof(reason), "malformed request: %s", err);
		r = deny(b, &j->q, reason, reply, rlen);
		goto done;
	}
	pthread_mutex_lock(&b->lock);
	why = policy_check(c, &j->u, j->q.method, now, b->start_ns);
	pthread_mutex_unlock(&b->lock);
	if (why) {
		r = deny(b, &j->q, why, reply, rlen);
		goto done;
	}
	for (i = 0; i < j->q.nheaders; i++) {
		const char *h = j->q.headers[i];

		if (!policy_header_allowed(c, h)) {
			snprintf(reason, sizeof(reason),
				 "malformed request: header %.*s not allowed",
				 (int)(strcspn(h, ":") > 64 ? 64 : strcspn(h, ":")), h);
			r = deny(b, &j->q, reason, reply, rlen);
			goto done;
		}
	}
	r = dest_resolve(j->u.host, j->u.port, c->allow_private, j->pin, sizeof(j->pin));
	if (r) {
		r = deny(b, &j->q, r == -EACCES ? "private destination" : "cannot resolve host",
			 reply, rlen);
		goto done;
	}
	/* Checked again with the use counted under one lock: an egress thread may have used the
	 * credential meanwhile (max_uses, rate). */
	pthread_mutex_lock(&b->lock);
	why = policy_check(c, &j->u, j->q.method, now, b->start_ns);
	if (!why)
		policy_consume(c, now);
	pthread_mutex_unlock(&b->lock);
	if (why) {
		r = deny(b, &j->q, why, reply, rlen);
		goto done;
	}
	j->c = c;
	r = helper_spawn(c, b->helper_timeout_ms, &j->hp, err, sizeof(err));
	if (r) {
		broker_log(b, LOG_WARN, "credential %s: %s", c->name, err);
		r = deny(b, &j->q, "credential helper failed", reply, rlen);
		goto done;
	}
	j->state = JOB_HELPER;
	*jobp = j;
	return 0;
done:
	job_free(j);
	return r;
}

enum job_state broker_job_state(const struct broker_job *j)
{
	return j->state;
}

int broker_job_helper_fd(const struct broker_job *j)
{
	return j->state == JOB_HELPER && !j->read_done ? j->hp.out_fd : -1;
}

int64_t broker_job_deadline(const struct broker_job *j)
{
	return j->state == JOB_HELPER ? j->hp.deadline_ns : -1;
}

int broker_job_read(struct broker_job *j)
{
	if (j->state == JOB_HELPER && !j->read_done && helper_read(&j->hp, NULL, 0) != 0)
		j->read_done = 1;
	return j->read_done;
}

int broker_job_advance(struct broker *b, struct broker_job *j, char **reply, size_t *rlen)
{
	struct secret sec;
	char err[256], reason[300], inject[INJECT_MAX];
	int r;

	*reply = NULL;
	r = helper_finish(&j->hp, &sec, err, sizeof(err));
	if (r == -EAGAIN)
		return JOB_WAIT;
	j->read_done = 1;
	if (r) {
		broker_log(b, LOG_WARN, "credential %s: %s", j->c->name, err);
		r = deny(b, &j->q, "credential helper failed", reply, rlen);
		goto done;
	}
	inject[0] = '\0';
	r = fill_template(j->c->inject_header, j->c->inject_template, &sec, inject, sizeof(inject));
	if (!r)
		r = scrub_add_credential(&j->sc, j->c->inject_template, sec.username, sec.password);
	secret_wipe(&sec);
	if (r) {
		OPENSSL_cleanse(inject, sizeof(inject));
		r = deny(b, &j->q,
			 r == -E2BIG ? "credential too long for the header" : "out of memory",
			 reply, rlen);
		goto done;
	}
	{
		struct fetch_req fr = {
		    .url = j->u.url,
		    .method = j->q.method,
		    .headers = j->q.headers,
		    .nheaders = j->q.nheaders,
		    .inject = inject,
		    .body = j->q.body,
		    .body_len = j->q.body_len,
		    .pin = j->pin,
		    .ca_file = j->c->ca_file,
		    .allow_private = j->c->allow_private,
		    .timeout_s = b->fetch_timeout_s,
		};

		r = fetch_start(&j->f, &fr, err, sizeof(err));
	}
	OPENSSL_cleanse(inject, sizeof(inject));
	if (r) {
		snprintf(reason, sizeof(reason), "upstream: %s", err);
		audit_write(b, &j->q, j->u.url, "allow", reason, 0);
		r = error_reply("", reason, reply, rlen);
		goto done;
	}
	j->state = JOB_TRANSFER;
	return JOB_TRANSFER;
done:
	job_free(j);
	return r ? r : JOB_DONE;
}

void broker_job_abort(struct broker *b, struct broker_job *j)
{
	char *reply = NULL;
	size_t rlen;

	if (j->state == JOB_TRANSFER) {
		broker_guest_finish(b, j, CURLE_ABORTED_BY_CALLBACK, &reply, &rlen);
	} else {
		helper_abort(&j->hp);
		deny(b, &j->q, "guest went away", &reply, &rlen);
		job_free(j);
	}
	free(reply);
}

int broker_guest_finish(struct broker *b, struct broker_job *j, int curl_result, char **reply,
			size_t *rlen)
{
	char err[256], reason[300];
	int r;

	*reply = NULL;
	r = fetch_end(&j->f, (CURLcode)curl_result, err, sizeof(err));
	if (r) {
		snprintf(reason, sizeof(reason), "upstream: %s", err);
		audit_write(b, &j->q, j->u.url, "allow", reason, 0);
		r = error_reply("", reason, reply, rlen);
		goto out;
	}
	r = build_ok_reply(&j->sc, &j->f.resp, reply, rlen);
	if (!r && *rlen > FRAME_MAX) {
		free(*reply);
		*reply = NULL;
		audit_write(b, &j->q, j->u.url, "allow", "upstream: reply over 1 MiB",
			    (int)j->f.resp.status);
		r = error_reply("", "upstream: reply over 1 MiB", reply, rlen);
		goto out;
	}
	audit_write(b, &j->q, j->u.url, "allow", r ? "upstream: out of memory" : "ok",
		    (int)j->f.resp.status);
	if (r)
		r = error_reply("", "upstream: out of memory", reply, rlen);
out:
	job_free(j);
	return r;
}

int broker_handle_guest(struct broker *b, const uint8_t *msg, size_t len, char **reply,
			size_t *rlen)
{
	struct broker_job *j;
	int r = broker_guest_begin(b, msg, len, reply, rlen, &j);

	if (r || !j)
		return r;
	/* Blocking: wait for the helper's output, then its exit, then run the transfer. */
	while (!j->read_done) {
		struct pollfd p = {.fd = j->hp.out_fd, .events = POLLIN};
		int64_t left = (j->hp.deadline_ns - broker_now_ns() + 999999) / 1000000;

		if (left <= 0)
			break;
		if (poll(&p, 1, (int)left) < 0 && errno != EINTR)
			break;
		broker_job_read(j);
	}
	while ((r = broker_job_advance(b, j, reply, rlen)) == JOB_WAIT)
		usleep(2000);
	if (r != JOB_TRANSFER)
		return r == JOB_DONE ? 0 : r;
	return broker_guest_finish(b, j, (int)curl_easy_perform(j->f.easy), reply, rlen);
}

int broker_handle_ctl(struct broker *b, const uint8_t *msg, size_t len, char **reply, size_t *rlen)
{
	json_error_t jerr;
	json_t *o = json_loadb((const char *)msg, len, JSON_REJECT_DUPLICATES, &jerr);
	const char *op = json_string_value(json_object_get(o, "op"));
	char hex[2 * REQ_TOKEN_BYTES + 1];
	int r;

	if (!op) {
		r = error_reply("", "malformed request: need {\"op\":\"grant\"|\"status\"}", reply,
				rlen);
	} else if (!strcmp(op, "grant")) {
		pthread_mutex_lock(&b->lock);
		if (RAND_bytes(b->token, REQ_TOKEN_BYTES) != 1) {
			pthread_mutex_unlock(&b->lock);
			r = error_reply("", "RAND_bytes failed", reply, rlen);
		} else {
			b->epoch++;
			b->have_token = true;
			b->start_ns = broker_now_ns();
			hex_encode(b->token, REQ_TOKEN_BYTES, hex);
			pthread_mutex_unlock(&b->lock);
			broker_log(b, LOG_DEBUG, "grant epoch %llu", (unsigned long long)b->epoch);
			r = dump_reply(json_pack("{sbsIss}", "ok", 1, "epoch", (json_int_t)b->epoch,
						 "token", hex),
				       reply, rlen);
			OPENSSL_cleanse(hex, sizeof(hex));
		}
	} else if (!strcmp(op, "status")) {
		r = dump_reply(json_pack("{sbsI}", "ok", 1, "epoch", (json_int_t)b->epoch), reply,
			       rlen);
	} else {
		r = error_reply("", "unknown op", reply, rlen);
	}
	json_decref(o);
	return r;
}
