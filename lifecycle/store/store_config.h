/* The host-side object store configuration (store.json) and the credentials it names. */
#ifndef COVE_STORE_CONFIG_H
#define COVE_STORE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define STORE_CONFIG_DEFAULT "/etc/cove/store.json"
#define STORE_CONFIG_MAX     16384 /* bytes of store.json */
#define STORE_CRED_FILE_MAX  8192  /* bytes of the credentials file */
#define STORE_ENDPOINT_MAX   256
#define STORE_BUCKET_MAX     63
#define STORE_PREFIX_MAX     256
#define STORE_REGION_MAX     32
#define STORE_PATH_MAX	     1024
#define STORE_KEY_ID_MAX     128
#define STORE_SECRET_MAX     128
#define STORE_TOKEN_MAX	     4096

enum store_addressing { STORE_ADDR_PATH = 0, STORE_ADDR_VIRTUAL };

#define STORE_FLEET_KEY_MAX 64	 /* bytes of the fleet key (64 hex digits in its file: 32) */
#define STORE_KEYSPEC_MAX   1024 /* a key provider spec, as `cove create --key` takes */
#define STORE_POLICIES_MAX  16
#define STORE_POLICY_ID_LEN 63

/* A policy id the store's manifests may name, and the host's own policy file for it. */
struct store_policy {
	char id[STORE_POLICY_ID_LEN + 1];
	char path[1024 + 1];
};

#define STORE_HOST_ID_MAX 64
#define STORE_CACHE_MAX_TEXT 32 /* bytes of "cache_max" ("2G") */

struct store_config {
	/* scheme://host[:port], no path, no trailing slash */
	char endpoint[STORE_ENDPOINT_MAX + 1];
	bool insecure_http; /* http:// allowed: only when store.json says so explicitly */
	char bucket[STORE_BUCKET_MAX + 1];
	char prefix[STORE_PREFIX_MAX + 1]; /* prepended to every key; may be empty */
	char region[STORE_REGION_MAX + 1];
	char ca_file[STORE_PATH_MAX + 1]; /* empty: the system's CA bundle */
	enum store_addressing addressing;
	char access_key_id[STORE_KEY_ID_MAX + 1];
	char secret_access_key[STORE_SECRET_MAX + 1];
	char session_token[STORE_TOKEN_MAX + 1]; /* may be empty */
	/*
	 * The host's side of what a manifest names (never taken from the store): the fleet key
	 * that MACs manifests ("fleet_key_file": a 0600 file of 64 hex digits), the key
	 * provider for each provider type ("key_providers": {"key-cmd": SPEC, "pkcs11": SPEC}),
	 * and the policy file for each policy id ("policies": {ID: PATH}).
	 */
	unsigned char fleet_key[STORE_FLEET_KEY_MAX];
	size_t fleet_key_len; /* 0: none configured */
	char key_cmd_spec[STORE_KEYSPEC_MAX + 1];
	char pkcs11_spec[STORE_KEYSPEC_MAX + 1];
	int nr_policies;
	struct store_policy policies[STORE_POLICIES_MAX];
	/*
	 * Ownership (lifecycle/store/lease.h): this host's id in leases ("host_id", default the
	 * host name: [A-Za-z0-9._-], 1-64 bytes), a lease's time to live ("lease_ttl_s", 10-3600,
	 * default 30) and the clock skew the fleet allows between hosts ("clock_skew_s", 0-60,
	 * default 2).
	 */
	char host_id[STORE_HOST_ID_MAX + 1];
	unsigned lease_ttl_s;
	unsigned clock_skew_s;
	/*
	 * The bound of this host's cache of the store ("cache_max": a size string such as "2G",
	 * at least 1M, at most 32 bytes of text; 0 when absent: no bound). `cove gc` evicts down to
	 * it (lifecycle/cache.h).
	 */
	uint64_t cache_max;
};

/* Where credentials come from when store.json names no credentials_file (the process's
 * AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN; NULL when unset). */
struct store_env {
	const char *access_key_id;
	const char *secret_access_key;
	const char *session_token;
};

/* A host id: 1-64 of [A-Za-z0-9._-]. */
bool store_host_id_ok(const char *s);

/* Fills env from this process's environment. */
void store_env_from_process(struct store_env *env);

/*
 * Parses store.json's text (len bytes, at most STORE_CONFIG_MAX): unknown keys, oversized or
 * malformed fields refused. Credentials from "credentials_file" (a regular 0600 file owned by
 * this uid, not a link) when named, else from env. 0 or -errno with one line in err.
 */
int store_config_parse(const char *text, size_t len, const struct store_env *env,
		       struct store_config *cfg, char *err, size_t errlen);

/* Reads path (NULL: $COVE_STORE, else STORE_CONFIG_DEFAULT) and parses it with the process's
 * environment. 0 or -errno with one line in err. */
int store_config_load(const char *path, struct store_config *cfg, char *err, size_t errlen);

/* Reads a credentials file (JSON: access_key_id, secret_access_key, optional session_token)
 * into cfg after checking its owner and mode. 0 or -errno with one line in err. */
int store_cred_file_read(const char *path, struct store_config *cfg, char *err, size_t errlen);

/* Reads the fleet key file (regular, not a link, owned by this uid, mode 0600, 64 hex digits
 * and an optional newline) into cfg. 0 or -errno with one line in err. */
int store_fleet_key_read(const char *path, struct store_config *cfg, char *err, size_t errlen);

/* Zeroes the secrets (explicit_bzero). */
void store_config_wipe(struct store_config *cfg);

#endif
