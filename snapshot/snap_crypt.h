/* Encryption of snapshot layers: the chain's data key, sealed layer metadata, sealed state files. */
#ifndef COVE_SNAP_CRYPT_H
#define COVE_SNAP_CRYPT_H

#include <stddef.h>
#include <stdint.h>

#include <pthread.h>

#include "snapshot/crypto.h"
#include "snapshot/mem_layer.h"
#include "devices/overlay.h"

struct keyprov;

/* A chain's unwrapped data key and one sealing context (one thread uses it). */
struct snap_crypt {
	struct snap_key *key;
	struct crypto_ctx *cc;
	uint8_t chain_id[CRYPTO_CHAIN_ID_LEN];
};

/*
 * Opens DIR/keys through `prov`, the host's provider (required; the keys file only records
 * which provider it expects, see keyfile_open) or, with `create`
 * and no keys file yet, makes a new data key wrapped by `prov`. 0 or -errno; a provider that
 * refuses gives -EKEYREJECTED and one line naming it in `err`.
 */
int snap_crypt_open(struct snap_crypt *sc, const char *dir, struct keyprov *prov, int create,
		    char *err, size_t errlen);
/*
 * The same; a chain it creates gets `inherit` as its data key (NULL: a new one), and an existing
 * one must hold that key (-EEXIST otherwise): see keyfile_create_with_key.
 */
int snap_crypt_open_key(struct snap_crypt *sc, const char *dir, struct keyprov *prov, int create,
			const struct snap_key *inherit, char *err, size_t errlen);
void snap_crypt_close(struct snap_crypt *sc);

/* Seals the SHA-256 of header bytes [0, MEM_LAYER_META_OFF) and both bitmaps into li->meta. */
int snap_crypt_seal_meta(struct snap_crypt *sc, const uint8_t *hdr, const uint8_t *bitmaps,
			 size_t bitmaps_len, uint8_t meta[MEM_LAYER_META_LEN]);
/*
 * Checks an open encrypted layer's header (salt included) and bitmaps against its sealed
 * digest, then registers the layer's subkey in sc->cc. 0 or -EBADMSG.
 */
int snap_crypt_check_layer(struct snap_crypt *sc, const struct mem_layer *l);
/*
 * A layer about to be written: a fresh random salt (stored in the layer's header) and its
 * subkey registered in sc->cc, so its pages never share a (key, nonce) pair with any other
 * layer, even one that got the same id. 0 or -errno.
 */
int snap_crypt_new_layer(struct snap_crypt *sc, uint64_t layer_id, uint8_t salt[CRYPTO_SALT_LEN]);

/* Encrypted state file: "COVESENC", version u32, 0 u32, layer id u64, then a sealed blob. */
#define STATE_ENC_MAGIC "COVESENC"
#define STATE_ENC_HDR 24
/* malloc'd encrypted image of a plain state file image. 0 or -errno. */
int snap_crypt_seal_state(struct snap_crypt *sc, uint64_t layer_id, const uint8_t *plain,
			  size_t len, uint8_t **out, size_t *out_len);
/* Decrypts an encrypted state image into a malloc'd plain one. -EBADMSG if altered/moved. */
int snap_crypt_open_state(struct snap_crypt *sc, uint64_t layer_id, const uint8_t *in, size_t len,
			  uint8_t **out, size_t *out_len, char *err, size_t errlen);
int snap_state_is_encrypted(const uint8_t *buf, size_t len);

/*
 * The sealer of one chain's disk overlay layers (devices/overlay.h): chunks sealed like pages
 * (subkey from the layer's salt, nonce from layer id and chunk index), maps authenticated by a
 * sealed SHA-256 of their header and bitmap ("cove-overlay-map" blob). It holds its own
 * context (a copy of the data key) behind a mutex, so vCPU threads may use it while the
 * snapshot writer uses the chain's context.
 */
struct snap_sealer {
	struct overlay_sealer ops;
	struct crypto_ctx *cc;
	uint8_t chain_id[CRYPTO_CHAIN_ID_LEN];
	pthread_mutex_t lock;
};
int snap_sealer_new(const struct snap_crypt *sc, struct snap_sealer **out);
void snap_sealer_free(struct snap_sealer *s);

#endif
