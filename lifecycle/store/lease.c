/* A sandbox's lease in the store (lease.h, LEASE.md). */
#include "lifecycle/store/lease.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/errmsg.h"
#include "lifecycle/store/json_mac.h"

#define LEASE_LABEL  "cove-lease-v1\n"
#define LEASE_FORMAT "cove-lease-1"
/* Reads and writes per take: a race lost re-reads; a store that changes it every time fails. */
#define TAKE_ROUNDS 4

static int lease_key(const char *name, char *key, size_t cap)
{
	return snprintf(key, cap, "sandboxes/%s/lease", name) < (int)cap ? 0 : -ENAMETOOLONG;
}

char *store_lease_encode(const struct store_lease *l, const uint8_t *key, size_t keylen)
{
	json_t *o =
	    json_pack("{s:s,s:s,s:s,s:I,s:I,s:I}", "format", LEASE_FORMAT, "sandbox", l->sandbox,
		      "host", l->host, "epoch", (json_int_t)l->epoch, "generation",
		      (json_int_t)l->generation, "expires_ms", (json_int_t)l->expires_ms);
	char *text = store_json_seal(o, LEASE_LABEL, key, keylen);
	json_decref(o);
	return text;
}

static int get_int(json_t *o, const char *k, json_int_t min, json_int_t *v, char *err,
		   size_t errlen)
{
	json_t *j = json_object_get(o, k);
	if (!json_is_integer(j) || json_integer_value(j) < min)
		return errmsg(err, errlen, -EBADMSG, "lease: \"%s\" is not an integer >= %lld", k,
			      (long long)min);
	*v = json_integer_value(j);
	return 0;
}

int store_lease_decode(const char *buf, size_t len, const uint8_t *key, size_t keylen,
		       struct store_lease *l, char *err, size_t errlen)
{
	int r;
	json_t *o = store_json_open(buf, len, LEASE_LABEL, key, keylen, "lease", &r, err, errlen);
	if (!o)
		return r;
	memset(l, 0, sizeof(*l));
	const char *fmt = json_string_value(json_object_get(o, "format"));
	const char *sbx = json_string_value(json_object_get(o, "sandbox"));
	const char *host = json_string_value(json_object_get(o, "host"));
	json_int_t epoch = 0, gen = 0, exp = 0;
	if (json_object_size(o) != 6 || !fmt || strcmp(fmt, LEASE_FORMAT))
		r = errmsg(err, errlen, -EBADMSG, "lease: not a %s object", LEASE_FORMAT);
	else if (!sbx || sbx_name_check(sbx, NULL, 0))
		r = errmsg(err, errlen, -EBADMSG, "lease: \"sandbox\" is not a sandbox name");
	else if (!host || (host[0] && !store_host_id_ok(host)))
		r = errmsg(err, errlen, -EBADMSG, "lease: \"host\" is not a host id");
	if (!r)
		r = get_int(o, "epoch", 1, &epoch, err, errlen);
	if (!r)
		r = get_int(o, "generation", 0, &gen, err, errlen);
	if (!r)
		r = get_int(o, "expires_ms", 0, &exp, err, errlen);
	if (!r) {
		snprintf(l->sandbox, sizeof(l->sandbox), "%s", sbx);
		snprintf(l->host, sizeof(l->host), "%s", host);
		l->epoch = (uint64_t)epoch;
		l->generation = (uint64_t)gen;
		l->expires_ms = exp;
	}
	json_decref(o);
	return r;
}

int store_lease_read(struct s3_client *c, const struct store_config *cfg, const char *name,
		     struct store_lease *l, char *err, size_t errlen)
{
	char key[S3_KEY_MAX], etag[S3_ETAG_MAX + 1] = "";
	char *buf = malloc(STORE_LEASE_MAX);
	size_t got = 0;
	int r = buf ? lease_key(name, key, sizeof(key)) : -ENOMEM;
	if (r)
		r = errmsg(err, errlen, r, "sandbox %s: lease key", name);
	if (!r)
		r = s3_get_etag(c, key, buf, STORE_LEASE_MAX, &got, etag, err, errlen);
	if (!r)
		r = store_lease_decode(buf, got, cfg->fleet_key, cfg->fleet_key_len, l, err,
				       errlen);
	if (!r && strcmp(l->sandbox, name))
		r = errmsg(err, errlen, -EBADMSG, "%s: the lease is of sandbox %s", key,
			   l->sandbox);
	if (!r && !etag[0])
		r = errmsg(err, errlen, -EBADMSG, "%s: the store sent no ETag", key);
	if (!r)
		memcpy(l->etag, etag, sizeof(l->etag));
	free(buf);
	return r;
}

/* Writes `want` over the version `if_match` (NULL: create-only); its new ETag into want. */
static int lease_write(struct s3_client *c, const struct store_config *cfg,
		       struct store_lease *want, const char *if_match, char *err, size_t errlen)
{
	char key[S3_KEY_MAX];
	if (lease_key(want->sandbox, key, sizeof(key)))
		return errmsg(err, errlen, -ENAMETOOLONG, "sandbox %s: lease key", want->sandbox);
	char *text = store_lease_encode(want, cfg->fleet_key, cfg->fleet_key_len);
	if (!text)
		return errmsg(err, errlen, -ENOMEM, "lease: cannot encode");
	int r = s3_put_cond(c, key, text, strlen(text), if_match, want->etag, err, errlen);
	free(text);
	return r;
}

/* The lease now in the store is the one we just tried to write (a lost reply, retried). */
static bool is_ours(const struct store_lease *cur, const struct store_lease *want)
{
	return !strcmp(cur->host, want->host) && cur->epoch == want->epoch &&
	       cur->expires_ms == want->expires_ms && cur->generation == want->generation;
}

int store_lease_take(struct s3_client *c, const struct store_config *cfg, const char *name,
		     uint64_t gen, int64_t now_ms, struct store_lease *held,
		     struct store_lease *other, char *err, size_t errlen)
{
	if (!cfg->fleet_key_len)
		return errmsg(err, errlen, -ENOKEY, "store.json names no fleet_key_file");
	const int64_t ttl = (int64_t)cfg->lease_ttl_s * 1000,
		      skew = (int64_t)cfg->clock_skew_s * 1000;
	struct store_lease want = {.generation = gen, .expires_ms = now_ms + ttl};
	snprintf(want.sandbox, sizeof(want.sandbox), "%s", name);
	snprintf(want.host, sizeof(want.host), "%s", cfg->host_id);
	struct store_lease cur;
	bool wrote = false;
	for (int round = 0; round < TAKE_ROUNDS; round++) {
		int r = store_lease_read(c, cfg, name, &cur, err, errlen);
		if (r && r != -ENOENT)
			return r;
		if (!r && wrote && is_ours(&cur, &want)) {
			*held = cur;
			return 0;
		}
		const char *if_match = NULL;
		if (r == -ENOENT) {
			want.epoch = 1;
		} else if (!strcmp(cur.host, cfg->host_id) && cur.expires_ms > now_ms) {
			want.epoch = cur.epoch; /* still ours: a restart on this host */
			if_match = cur.etag;
		} else if (!cur.host[0] || now_ms > cur.expires_ms + skew) {
			want.epoch = cur.epoch + 1; /* free, or expired past the allowed skew */
			if_match = cur.etag;
		} else {
			*other = cur;
			return errmsg(err, errlen, -EBUSY,
				      "sandbox %s runs on host %s (its lease expires in %lld ms)",
				      name, cur.host, (long long)(cur.expires_ms - now_ms));
		}
		r = lease_write(c, cfg, &want, if_match, err, errlen);
		if (!r) {
			*held = want;
			return 0;
		}
		if (r != -EEXIST && r != -ESTALE)
			return r;
		wrote = true; /* lost a race, or our own retried write landed: read again */
	}
	*other = cur;
	return errmsg(err, errlen, -EBUSY, "sandbox %s: its lease kept changing (%d rounds)", name,
		      TAKE_ROUNDS);
}

/*
 * After a 412 on our own If-Match write: 0 if the store holds exactly what we wrote (a lost
 * reply, retried); -EAGAIN with *held updated if the lease is still ours at the same epoch but
 * in a newer version (this host's other process renewed it: write again over that); else
 * -ESTALE naming the owner.
 */
static int settle_412(struct s3_client *c, const struct store_config *cfg, struct store_lease *held,
		      const struct store_lease *want, char *err, size_t errlen)
{
	struct store_lease cur;
	char why[256];
	int r = store_lease_read(c, cfg, held->sandbox, &cur, why, sizeof(why));
	if (!r && is_ours(&cur, want)) {
		*held = cur;
		return 0;
	}
	if (!r && !strcmp(cur.host, held->host) && cur.epoch == held->epoch) {
		*held = cur;
		return -EAGAIN;
	}
	if (r)
		return errmsg(err, errlen, -ESTALE, "sandbox %s: the lease changed: %s",
			      held->sandbox, why);
	return errmsg(err, errlen, -ESTALE,
		      "sandbox %s: the lease moved on: host %s holds it (epoch %llu, ours %llu)",
		      held->sandbox, cur.host[0] ? cur.host : "(none)",
		      (unsigned long long)cur.epoch, (unsigned long long)held->epoch);
}

/* Writes `held` changed by `set` over its own version, following this host's renewals. */
static int rewrite(struct s3_client *c, const struct store_config *cfg, struct store_lease *held,
		   int64_t expires_ms, bool release, char *err, size_t errlen)
{
	int r = -EAGAIN;
	for (int i = 0; i < 3 && r == -EAGAIN; i++) {
		struct store_lease want = *held;
		want.expires_ms = expires_ms;
		if (release)
			want.host[0] = '\0';
		r = lease_write(c, cfg, &want, held->etag, err, errlen);
		if (r == -ESTALE)
			r = settle_412(c, cfg, held, &want, err, errlen);
		else if (!r)
			*held = want;
	}
	if (r == -EAGAIN)
		r = errmsg(err, errlen, -ESTALE, "sandbox %s: the lease kept changing",
			   held->sandbox);
	return r;
}

int store_lease_renew(struct s3_client *c, const struct store_config *cfg, struct store_lease *held,
		      int64_t now_ms, char *err, size_t errlen)
{
	return rewrite(c, cfg, held, now_ms + (int64_t)cfg->lease_ttl_s * 1000, false, err, errlen);
}

int store_lease_release(struct s3_client *c, const struct store_config *cfg,
			struct store_lease *held, char *err, size_t errlen)
{
	return rewrite(c, cfg, held, 0, true, err, errlen);
}
