/* AES-256-GCM for snapshot pages and blobs: locked data key, per-thread contexts, nonce, AAD. */
#ifndef COVE_CRYPTO_H
#define COVE_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

/*
 * One random 256-bit data key encrypts one snapshot chain. Every 4 KiB memory page and every
 * disk overlay chunk is sealed on its own with AES-256-GCM under its layer's subkey:
 *
 *   subkey (256 bits) = HKDF-SHA256(data key, salt = the layer's random 16-byte salt,
 *                                   info = "cove-layer-key-v2" || layer_id (u64 LE))
 *   nonce (96 bits)   = layer_id (32 bits, big-endian) || index (64 bits, big-endian)
 *   AAD               = "cove-page-v1" || chain_id (16) || layer_id (u64 LE) || index (u64 LE)
 *                       || len (u64 LE)
 *
 * A layer's salt is drawn fresh when the layer is written and stored in its header, so even a
 * layer id handed out twice (a rolled-back counter, two copies of one chain) gives two subkeys:
 * a (subkey, nonce) pair repeats only if a 128-bit random salt does. A layer seals each index
 * at most once. Register a layer (crypto_ctx_add_layer) before sealing or opening its pages;
 * pages are never sealed under the data key itself (-ENOKEY for an unregistered layer). Layer
 * ids 0..CRYPTO_LAYER_MAX are valid; larger ids are rejected (-ERANGE). The AAD binds chain,
 * layer, index and length, so a page moved to another index, layer or chain fails to open.
 *
 * State files and other small records use crypto_seal_blob: nonce = 0xffffffff || 64 random
 * bits (never equal to a page nonce), AAD = "cove-blob-v1" || chain_id || domain string.
 *
 * See snapshot/CRYPTO.md for the full argument.
 */

#define CRYPTO_KEY_LEN	    32
#define CRYPTO_TAG_LEN	    16
#define CRYPTO_NONCE_LEN    12
#define CRYPTO_CHAIN_ID_LEN 16
#define CRYPTO_SALT_LEN	    16 /* per layer, random */
#define CRYPTO_LAYER_MAX    0xfffffffeULL
#define CRYPTO_PAGE_MAX_LEN (16u << 20) /* one sealed page/chunk, at most */
#define CRYPTO_BLOB_MAX_LEN (256u << 20)
/* crypto_seal_blob output = nonce || ciphertext || tag */
#define CRYPTO_BLOB_OVERHEAD (CRYPTO_NONCE_LEN + CRYPTO_TAG_LEN)

/* A data key in mlock'ed, MADV_DONTDUMP memory, cleansed and unlocked on free. */
struct snap_key;

/* Per-thread sealing context bound to one key (holds OpenSSL contexts keyed once). */
struct crypto_ctx;

/* A fresh random data key (OpenSSL's CSPRNG). 0 or -errno. */
int crypto_key_generate(struct snap_key **out);
/* A key from 32 raw bytes (an unwrapped data key). The caller cleanses raw afterwards. */
int crypto_key_import(const uint8_t raw[CRYPTO_KEY_LEN], struct snap_key **out);
/* The raw key bytes, for key providers that wrap them. Never log or store them. */
const uint8_t *crypto_key_bytes(const struct snap_key *key);
/* 1 when the key's memory is mlock'ed (mlock can fail under a small RLIMIT_MEMLOCK). */
int crypto_key_locked(const struct snap_key *key);
void crypto_key_free(struct snap_key *key);

/* A context for sealing/opening with key. Not thread-safe: one per thread. 0 or -errno. */
int crypto_ctx_new(const struct snap_key *key, struct crypto_ctx **out);
void crypto_ctx_free(struct crypto_ctx *cc);

/*
 * Registers a layer: derives its subkey from the data key and its salt (never all zeros:
 * -EINVAL) and keys a context pair for it. Pages of layer_id then use the (id, salt) registered
 * or re-registered last (two disk layers may share an id, never a salt). A context remembers up
 * to 1024 layers, forgetting the oldest. 0, -ERANGE, -EINVAL, -EIO, -ENOMEM.
 */
int crypto_ctx_add_layer(struct crypto_ctx *cc, uint64_t layer_id,
			 const uint8_t salt[CRYPTO_SALT_LEN]);
/* A new context (for another thread) with the same data key and registered layers. */
int crypto_ctx_dup(const struct crypto_ctx *cc, struct crypto_ctx **out);
/* The subkey of (layer_id, salt) under key (exposed for tests). 0 or -EIO. */
int crypto_layer_key(const struct snap_key *key, uint64_t layer_id,
		     const uint8_t salt[CRYPTO_SALT_LEN], uint8_t out[CRYPTO_KEY_LEN]);

/* The page nonce for (layer_id, index); -ERANGE when layer_id > CRYPTO_LAYER_MAX. */
int crypto_page_nonce(uint64_t layer_id, uint64_t index, uint8_t nonce[CRYPTO_NONCE_LEN]);

/*
 * Seal len bytes (1..CRYPTO_PAGE_MAX_LEN) of plain into out (len bytes, may equal plain) and
 * tag, under the layer's subkey. 0, -ENOKEY (layer not registered), -ERANGE (layer id too
 * large), -EINVAL (len), -EIO (OpenSSL failure).
 */
int crypto_seal_page(struct crypto_ctx *cc, const uint8_t chain_id[CRYPTO_CHAIN_ID_LEN],
		     uint64_t layer_id, uint64_t index, const void *plain, size_t len, void *out,
		     uint8_t tag[CRYPTO_TAG_LEN]);
/*
 * Open what crypto_seal_page sealed with the same chain_id, layer_id, index and len. out (may
 * equal cipher) is zeroed on failure. 0, -EBADMSG (tag mismatch: tampered, wrong place, wrong
 * key or salt), -ENOKEY, -ERANGE, -EINVAL, -EIO.
 */
int crypto_open_page(struct crypto_ctx *cc, const uint8_t chain_id[CRYPTO_CHAIN_ID_LEN],
		     uint64_t layer_id, uint64_t index, const void *cipher, size_t len, void *out,
		     const uint8_t tag[CRYPTO_TAG_LEN]);

/*
 * Seal a blob (state file, metadata): out must hold len + CRYPTO_BLOB_OVERHEAD bytes and gets
 * nonce || ciphertext || tag. domain (e.g. "state") is bound into the AAD so a blob of one kind
 * cannot be passed off as another. len may be 0. 0 or -errno as above.
 */
int crypto_seal_blob(struct crypto_ctx *cc, const uint8_t chain_id[CRYPTO_CHAIN_ID_LEN],
		     const char *domain, const void *plain, size_t len, void *out);
/*
 * Open a blob of in_len bytes (>= CRYPTO_BLOB_OVERHEAD) into out (in_len - CRYPTO_BLOB_OVERHEAD
 * bytes). 0, -EBADMSG (tampered, truncated, wrong chain/domain/key), -EINVAL, -EIO.
 */
int crypto_open_blob(struct crypto_ctx *cc, const uint8_t chain_id[CRYPTO_CHAIN_ID_LEN],
		     const char *domain, const void *in, size_t in_len, void *out);

/* Random bytes from OpenSSL's CSPRNG (chain ids, IVs). 0 or -EIO. */
int crypto_random(void *buf, size_t len);
/* Zero memory in a way the compiler cannot drop. */
void crypto_cleanse(void *buf, size_t len);

#endif
