/* Generation manifests: encode with a MAC, decode checking the MAC and then every field. */
#include "lifecycle/store/manifest.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "common/errmsg.h"
#include "lifecycle/store/json_mac.h"
#include "lifecycle/store/sync.h"
#include "lifecycle/template.h"

#define MAC_LABEL "cove-manifest-v1\n"
#define MAX_MEM	  (1ULL << 40)
#define MAX_VCPUS 64

bool store_file_name_ok(const char *name)
{
	size_t n = strnlen(name, STORE_FILE_NAME_MAX);
	if (n == 0 || n >= STORE_FILE_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];
		bool alnum =
		    (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
		if (!alnum && (i == 0 || (c != '.' && c != '_' && c != '-')))
			return false;
	}
	return true;
}

static bool policy_id_ok(const char *s)
{
	size_t n = strnlen(s, STORE_POLICY_ID_MAX);
	if (n == 0 || n >= STORE_POLICY_ID_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
			  (i && (c == '.' || c == '_' || c == '-'));
		if (!ok)
			return false;
	}
	return true;
}

/* HMAC-SHA256 over the label and the compact, key-sorted JSON of o (without "mac"). */
static int mac_of(json_t *o, const uint8_t *key, size_t keylen, uint8_t mac[32])
{
	return store_json_mac(o, MAC_LABEL, key, keylen, mac);
}

static json_t *machine_json(const struct store_manifest *m)
{
	json_t *disks = json_array();
	for (int i = 0; disks && i < m->nr_disks; i++)
		json_array_append_new(disks,
				      json_pack("{s:b,s:b}", "read_only", m->disks[i].read_only,
						"overlay", m->disks[i].overlay));
	return json_pack("{s:I,s:i,s:s,s:o,s:I}", "mem_bytes", (json_int_t)m->mem_bytes, "vcpus",
			 m->vcpus, "cmdline", m->cmdline, "disks", disks, "vsock_rate",
			 (json_int_t)m->vsock_rate);
}

char *store_manifest_encode(const struct store_manifest *m, const uint8_t *key, size_t keylen,
			    char *err, size_t errlen)
{
	if (keylen < STORE_FLEET_KEY_MIN) {
		errmsg(err, errlen, -EINVAL, "manifest: the fleet key is shorter than %d bytes",
		       STORE_FLEET_KEY_MIN);
		return NULL;
	}
	json_t *files = json_array();
	for (size_t i = 0; files && i < m->nr_files; i++) {
		char hex[DIGEST_HEX_LEN];
		digest_hex(m->files[i].digest, hex);
		json_array_append_new(files,
				      json_pack("{s:s,s:I,s:s}", "name", m->files[i].name, "size",
						(json_int_t)m->files[i].size, "sha256", hex));
	}
	json_t *o = json_pack(
	    "{s:s,s:s,s:I,s:I,s:I,s:o,s:I,s:I,s:o,s:o,s:o}", "format", STORE_MANIFEST_FORMAT,
	    "sandbox", m->sandbox, "generation", (json_int_t)m->generation, "created_ms",
	    (json_int_t)m->created_ms, "layer", (json_int_t)m->layer, "machine", machine_json(m),
	    "snapshot_every_ms", (json_int_t)m->snapshot_every_ms, "idle_stop_ms",
	    (json_int_t)m->idle_stop_ms, "key_provider",
	    m->key_type[0] ? json_string(m->key_type) : json_null(), "policy",
	    m->policy_id[0] ? json_string(m->policy_id) : json_null(), "files", files);
	if (o && m->lease && json_object_set_new(o, "lease", json_integer((json_int_t)m->lease))) {
		json_decref(o);
		o = NULL;
	}
	char *out = NULL;
	uint8_t mac[32];
	if (o && !mac_of(o, key, keylen, mac)) {
		char hex[DIGEST_HEX_LEN];
		digest_hex(mac, hex);
		if (!json_object_set_new(o, "mac", json_string(hex)))
			out = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENSURE_ASCII);
	}
	json_decref(o);
	if (!out)
		errmsg(err, errlen, -ENOMEM, "manifest: cannot encode (out of memory)");
	return out;
}

/* Refuses any key of o not in `known` (NULL-terminated), naming it. */
static int only_known(json_t *o, const char *const *known, const char *where, char *err,
		      size_t errlen)
{
	const char *k;
	json_t *v;
	json_object_foreach(o, k, v)
	{
		bool ok = false;
		for (int i = 0; known[i] && !ok; i++)
			ok = !strcmp(k, known[i]);
		if (!ok)
			return errmsg(
			    err, errlen, -EINVAL,
			    "manifest: unknown field \"%.40s\" in %s (a manifest names no "
			    "host path and no command)",
			    k, where);
	}
	return 0;
}

static int get_u64(json_t *o, const char *name, uint64_t min, uint64_t max, uint64_t *out,
		   char *err, size_t errlen)
{
	json_t *v = json_object_get(o, name);
	if (!json_is_integer(v) || json_integer_value(v) < 0 ||
	    (uint64_t)json_integer_value(v) < min || (uint64_t)json_integer_value(v) > max)
		return errmsg(err, errlen, -EINVAL,
			      "manifest: \"%s\" is missing or not an integer in [%llu, %llu]", name,
			      (unsigned long long)min, (unsigned long long)max);
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

static int get_str(json_t *o, const char *name, char *out, size_t cap, bool nullable, char *err,
		   size_t errlen)
{
	json_t *v = json_object_get(o, name);
	if (nullable && json_is_null(v)) {
		out[0] = 0;
		return 0;
	}
	if (!json_is_string(v) || json_string_length(v) >= cap ||
	    strlen(json_string_value(v)) != json_string_length(v))
		return errmsg(err, errlen, -EINVAL,
			      "manifest: \"%s\" is missing, not a string or over %zu bytes", name,
			      cap - 1);
	memcpy(out, json_string_value(v), json_string_length(v) + 1);
	return 0;
}

static int decode_machine(json_t *mo, struct store_manifest *m, char *err, size_t errlen)
{
	static const char *const known[] = {"mem_bytes", "vcpus",      "cmdline",
					    "disks",	 "vsock_rate", NULL};
	if (!json_is_object(mo))
		return errmsg(err, errlen, -EINVAL, "manifest: \"machine\" is not an object");
	uint64_t v;
	int r = only_known(mo, known, "machine", err, errlen);
	if (!r)
		r = get_u64(mo, "mem_bytes", 1 << 20, MAX_MEM, &m->mem_bytes, err, errlen);
	if (!r)
		r = get_u64(mo, "vcpus", 1, MAX_VCPUS, &v, err, errlen);
	m->vcpus = (int)v;
	if (!r)
		r = get_u64(mo, "vsock_rate", 0, UINT32_MAX * 1024ULL, &m->vsock_rate, err, errlen);
	if (!r)
		r = get_str(mo, "cmdline", m->cmdline, sizeof(m->cmdline), false, err, errlen);
	if (r)
		return r;
	json_t *d = json_object_get(mo, "disks");
	if (!json_is_array(d) || json_array_size(d) > SBX_MAX_DISKS)
		return errmsg(err, errlen, -EINVAL,
			      "manifest: \"disks\" is not an array of at most %d", SBX_MAX_DISKS);
	static const char *const dk[] = {"read_only", "overlay", NULL};
	size_t i;
	json_t *e;
	json_array_foreach(d, i, e)
	{
		json_t *ro = json_object_get(e, "read_only"), *ov = json_object_get(e, "overlay");
		if (!json_is_object(e) || only_known(e, dk, "a disk", err, errlen) ||
		    !json_is_boolean(ro) || !json_is_boolean(ov))
			return errmsg(err, errlen, -EINVAL,
				      "manifest: disk %zu is not {read_only, overlay} booleans", i);
		m->disks[i].read_only = json_is_true(ro);
		m->disks[i].overlay = json_is_true(ov);
	}
	m->nr_disks = (int)json_array_size(d);
	return 0;
}

static int decode_files(json_t *fa, struct store_manifest *m, char *err, size_t errlen)
{
	static const char *const known[] = {"name", "size", "sha256", NULL};
	if (!json_is_array(fa) || json_array_size(fa) > STORE_MANIFEST_MAX_FILES)
		return errmsg(err, errlen, -EINVAL,
			      "manifest: \"files\" is not an array of at most %d",
			      STORE_MANIFEST_MAX_FILES);
	m->nr_files = json_array_size(fa);
	m->files = calloc(m->nr_files ? m->nr_files : 1, sizeof(*m->files));
	if (!m->files)
		return errmsg(err, errlen, -ENOMEM, "manifest: out of memory");
	size_t i;
	json_t *e;
	json_array_foreach(fa, i, e)
	{
		struct store_file *f = &m->files[i];
		json_t *h = json_object_get(e, "sha256");
		int r = json_is_object(e) ? only_known(e, known, "a file", err, errlen)
					  : errmsg(err, errlen, -EINVAL,
						   "manifest: file %zu is not an object", i);
		if (!r)
			r = get_str(e, "name", f->name, sizeof(f->name), false, err, errlen);
		if (!r && !store_file_name_ok(f->name))
			r = errmsg(err, errlen, -EINVAL,
				   "manifest: file name \"%.64s\" is not a plain name (never a "
				   "path)",
				   f->name);
		if (!r)
			r = get_u64(e, "size", 0, 1ULL << 40, &f->size, err, errlen);
		if (!r && (!json_is_string(h) || digest_unhex(json_string_value(h), f->digest)))
			r = errmsg(err, errlen, -EINVAL,
				   "manifest: file \"%s\": sha256 is not 64 lower-case hex digits",
				   f->name);
		for (size_t j = 0; !r && j < i; j++)
			if (!strcmp(m->files[j].name, f->name))
				r = errmsg(err, errlen, -EINVAL,
					   "manifest: file \"%s\" is named twice", f->name);
		if (r)
			return r;
	}
	return 0;
}

static int decode_fields(json_t *o, struct store_manifest *m, char *err, size_t errlen)
{
	static const char *const known[] = {
	    "format", "sandbox",	   "generation",   "created_ms",   "layer",  "machine",
	    "files",  "snapshot_every_ms", "idle_stop_ms", "key_provider", "policy", "lease",
	    NULL};
	char fmt[32];
	uint64_t v;
	int r = only_known(o, known, "the manifest", err, errlen);
	if (!r)
		r = get_str(o, "format", fmt, sizeof(fmt), false, err, errlen);
	if (!r && strcmp(fmt, STORE_MANIFEST_FORMAT))
		r = errmsg(err, errlen, -EINVAL, "manifest: format \"%s\" is not %s", fmt,
			   STORE_MANIFEST_FORMAT);
	if (!r)
		r = get_str(o, "sandbox", m->sandbox, sizeof(m->sandbox), false, err, errlen);
	if (!r)
		r = m->sandbox[0] == STORE_TPL_MARK ? tpl_name_check(m->sandbox + 1, err, errlen)
						    : sbx_name_check(m->sandbox, err, errlen);
	if (!r)
		r = get_u64(o, "generation", 1, INT64_MAX, &m->generation, err, errlen);
	if (!r && json_object_get(o, "lease"))
		r = get_u64(o, "lease", 1, INT64_MAX, &m->lease, err, errlen);
	if (!r)
		r = get_u64(o, "created_ms", 0, INT64_MAX, &v, err, errlen);
	m->created_ms = (int64_t)v;
	if (!r)
		r = get_u64(o, "layer", 1, INT64_MAX, &m->layer, err, errlen);
	if (!r)
		r = get_u64(o, "snapshot_every_ms", 0, INT64_MAX, &m->snapshot_every_ms, err,
			    errlen);
	if (!r)
		r = get_u64(o, "idle_stop_ms", 0, INT64_MAX, &m->idle_stop_ms, err, errlen);
	char kt[256];
	if (!r)
		r = get_str(o, "key_provider", kt, sizeof(kt), true, err, errlen);
	if (!r && kt[0] && strcmp(kt, "key-cmd") && strcmp(kt, "pkcs11"))
		r = errmsg(err, errlen, -EINVAL,
			   "manifest: key_provider must be a type (\"key-cmd\" or \"pkcs11\"), "
			   "never a command or a module");
	if (!r)
		memcpy(m->key_type, kt, strlen(kt) + 1); /* "", "key-cmd" or "pkcs11" */
	if (!r)
		r = get_str(o, "policy", m->policy_id, sizeof(m->policy_id), true, err, errlen);
	if (!r && m->policy_id[0] && !policy_id_ok(m->policy_id))
		r = errmsg(err, errlen, -EINVAL,
			   "manifest: policy must be an id of the host's policy set "
			   "([a-z0-9][a-z0-9._-]*), never a path");
	if (!r)
		r = decode_machine(json_object_get(o, "machine"), m, err, errlen);
	if (!r)
		r = decode_files(json_object_get(o, "files"), m, err, errlen);
	return r;
}

int store_manifest_decode(const char *buf, size_t len, const uint8_t *key, size_t keylen,
			  struct store_manifest *m, char *err, size_t errlen)
{
	memset(m, 0, sizeof(*m));
	if (len > STORE_MANIFEST_MAX)
		return errmsg(err, errlen, -EFBIG, "manifest: %zu bytes, over the cap of %u", len,
			      STORE_MANIFEST_MAX);
	if (keylen < STORE_FLEET_KEY_MIN)
		return errmsg(err, errlen, -EINVAL, "manifest: the fleet key is too short");
	json_error_t je;
	json_t *o = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
	if (!json_is_object(o)) {
		json_decref(o);
		return errmsg(err, errlen, -EBADMSG, "manifest: not a JSON object (%.80s)",
			      je.text);
	}
	int r = 0;
	json_t *mv = json_object_get(o, "mac");
	uint8_t want[32], got[32];
	const char *hex = json_string_value(mv);
	if (!hex || digest_unhex(hex, want))
		r = errmsg(err, errlen, -EBADMSG, "manifest: no MAC (64 lower-case hex digits)");
	if (!r) {
		json_incref(mv);
		json_object_del(o, "mac");
		r = mac_of(o, key, keylen, got);
		json_decref(mv);
		if (r)
			r = errmsg(err, errlen, r, "manifest: cannot compute its MAC");
		else if (CRYPTO_memcmp(want, got, 32))
			r = errmsg(err, errlen, -EBADMSG,
				   "manifest: bad MAC (not written by a host of this fleet, or "
				   "changed since)");
	}
	if (!r)
		r = decode_fields(o, m, err, errlen);
	json_decref(o);
	if (r)
		store_manifest_free(m);
	return r;
}

void store_manifest_free(struct store_manifest *m)
{
	free(m->files);
	m->files = NULL;
	m->nr_files = 0;
}
