/* The "keys" file of a snapshot chain: chain id, provider description, wrapped data key. */
#ifndef COVE_KEYFILE_H
#define COVE_KEYFILE_H

#include <stddef.h>
#include <stdint.h>

#include "snapshot/crypto.h"
#include "snapshot/keyprov.h"

/*
 * DIR/keys, little-endian (see snapshot/CRYPTO.md):
 *   magic "COVEKEYS" (8) | version u32 (1) | chain_id (16) | provider type u32 |
 *   config_len u32 | wrapped_len u32 | key check value (16) | config | wrapped | crc32 u32 (IEEE)
 * The key check value is HMAC-SHA256(data key, "cove-kcv-v1" || chain_id), truncated: after
 * unwrapping it proves the provider returned this chain's key. The CRC catches corruption.
 * Reads are capped at KEYFILE_MAX bytes; config_len <= KEYPROV_CONFIG_MAX, wrapped_len <=
 * KEYPROV_WRAPPED_MAX. Writes go to a temporary file, fsync, rename, fsync of the directory.
 *
 * DIR/layer-seq holds the next layer id (see keyfile_next_layer_id).
 */

#define KEYFILE_NAME	"keys"
#define KEYFILE_VERSION 2 /* 2: layers carry salts, layer-seq is created with the file */
#define KEYFILE_MAX	(64u << 10)

/*
 * Pure: checks a whole keys file image (what keyfile_describe and keyfile_open read from DIR/keys:
 * magic, version, lengths, CRC, provider type) and returns its provider type, config and chain
 * id. `name` prefixes the error. 0, or -EINVAL with one line in err.
 */
int keyfile_parse(const uint8_t *buf, size_t len, const char *name, enum keyprov_type *type,
		  char *config, size_t config_len, uint8_t chain_id[CRYPTO_CHAIN_ID_LEN], char *err,
		  size_t errlen);

/*
 * Create DIR/keys for a new chain: a random chain id and data key, wrapped by prov. Fails with
 * -EEXIST when DIR/keys exists. *key_out (free with crypto_key_free) and chain_id get the new
 * chain's key and id. 0 or -errno with one line in err.
 */
int keyfile_create(const char *dir, struct keyprov *prov, struct snap_key **key_out,
		   uint8_t chain_id[CRYPTO_CHAIN_ID_LEN], char *err, size_t errlen);
/*
 * The same with a given data key (NULL: a new one): a chain started by a restored sandbox
 * keeps the data key of the chain it came from, whose disk layers it still reads (its own
 * chain id and counter; per-layer salts keep every nonce unique, snapshot/CRYPTO.md).
 */
int keyfile_create_with_key(const char *dir, struct keyprov *prov, const struct snap_key *key_in,
			    struct snap_key **key_out, uint8_t chain_id[CRYPTO_CHAIN_ID_LEN],
			    char *err, size_t errlen);

/*
 * Read DIR/keys and unwrap its data key with prov, the host's provider (required: a provider
 * is never built from the file). The provider the file records must be prov (same type and
 * config), else -EKEYREJECTED before prov runs. 0; -ENOENT (no keys file), -EINVAL (prov
 * NULL; corrupt, truncated, wrong magic/version, oversize field: err says which),
 * -EKEYREJECTED (another provider recorded, or the provider refused: err is the revocation
 * line), -EBADMSG (the unwrapped key is not this chain's), -errno.
 */
int keyfile_open(const char *dir, struct keyprov *prov, struct snap_key **key_out,
		 uint8_t chain_id[CRYPTO_CHAIN_ID_LEN], char *err, size_t errlen);

/*
 * Rewrap DIR/keys' data key: unwrap with old_prov (required, checked as in keyfile_open), wrap
 * with new_prov, replace the file atomically. Data files are never touched; chain id and data key
 * stay the same. 0 or -errno as keyfile_open.
 */
int keyfile_rekey(const char *dir, struct keyprov *old_prov, struct keyprov *new_prov, char *err,
		  size_t errlen);

/*
 * Describe DIR/keys without unwrapping: the provider type and config it records (untrusted
 * text from the file: never run it, print it only for diagnostics). 0 or -errno.
 */
int keyfile_describe(const char *dir, enum keyprov_type *type, char *config, size_t config_len,
		     uint8_t chain_id[CRYPTO_CHAIN_ID_LEN], char *err, size_t errlen);

/*
 * Hand out the next layer id of DIR's chain (1, 2, ...; keyfile_create starts the counter),
 * durably: DIR/layer-seq is updated and fsync'ed (under flock) before the id is returned, so
 * an id is never handed out twice even if the writer then crashes. Refused with -ESTALE and
 * one line when DIR/layer-seq is missing, or when DIR holds a layer file (see
 * keyfile_name_layer_id) whose id is not below the counter: a rolled-back or copied counter.
 * -EINVAL when corrupt, -ERANGE once ids pass CRYPTO_LAYER_MAX.
 */
int keyfile_next_layer_id(const char *dir, uint64_t *id, char *err, size_t errlen);
/*
 * Where replacing layer-seq is not allowed (the jailed VMM's filter answers EPERM), the counter
 * moves by create-only steps, DIR/layer-seq.N (N the next id, 20 digits); the counter is the
 * larger of layer-seq and the largest step. Host side (no VMM running on DIR): folds the steps
 * into layer-seq and removes them and the temporary files a refused replace left. 0 or -errno.
 */
int keyfile_settle_layer_seq(const char *dir, char *err, size_t errlen);
/* The checks of keyfile_next_layer_id without taking an id (restore, before the guest runs). */
int keyfile_check_layer_ids(const char *dir, char *err, size_t errlen);
/* The layer id in a chain file's name (mem-N, state-N, diskK-N.ovl[.map], temporaries): 1/0. */
int keyfile_name_layer_id(const char *name, uint64_t *id);

#endif
