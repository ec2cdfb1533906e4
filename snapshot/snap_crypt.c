/* Encryption of snapshot layers: the chain's data key, sealed layer metadata, sealed state files. */
#include "snapshot/snap_crypt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/evp.h>

#include "common/file_io.h"
#include "common/byteorder.h"
#include "common/errmsg.h"
#include "snapshot/keyfile.h"
#include "snapshot/layer_restore.h"

int snap_crypt_open_key(struct snap_crypt *sc, const char *dir, struct keyprov *prov, int create,
			const struct snap_key *inherit, char *err, size_t errlen)
{
	memset(sc, 0, sizeof(*sc));
	if (!prov)
		return errmsg(err, errlen, -EINVAL,
			      "%s: an encrypted chain needs its key provider from the host", dir);
	char path[4200];
	struct stat st;
	snprintf(path, sizeof(path), "%s/%s", dir, KEYFILE_NAME);
	int r;
	if (stat(path, &st) < 0 && errno == ENOENT) {
		if (!create)
			return errmsg(err, errlen, -ENOENT, "%s has no keys file", dir);
		r = keyfile_create_with_key(dir, prov, inherit, &sc->key, sc->chain_id, err,
					    errlen);
	} else {
		r = keyfile_open(dir, prov, &sc->key, sc->chain_id, err, errlen);
		/* Its disk layers would be sealed under another key than the ones it shares. */
		if (!r && inherit &&
		    CRYPTO_memcmp(crypto_key_bytes(inherit), crypto_key_bytes(sc->key),
				  CRYPTO_KEY_LEN)) {
			snap_crypt_close(sc);
			return errmsg(
			    err, errlen, -EEXIST,
			    "%s holds another encrypted chain (another data key): use a new "
			    "directory",
			    dir);
		}
	}
	if (r)
		return r;
	r = crypto_ctx_new(sc->key, &sc->cc);
	if (r) {
		snap_crypt_close(sc);
		return errmsg(err, errlen, r, "cannot set up AES-GCM: %s", strerror(-r));
	}
	return 0;
}

int snap_crypt_open(struct snap_crypt *sc, const char *dir, struct keyprov *prov, int create,
		    char *err, size_t errlen)
{
	return snap_crypt_open_key(sc, dir, prov, create, NULL, err, errlen);
}

void snap_crypt_close(struct snap_crypt *sc)
{
	if (sc->cc)
		crypto_ctx_free(sc->cc);
	if (sc->key)
		crypto_key_free(sc->key);
	memset(sc, 0, sizeof(*sc));
}

static int digest(const uint8_t *hdr, const uint8_t *bitmaps, size_t len, uint8_t out[32])
{
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	unsigned int n = 0;
	int ok = md && EVP_DigestInit_ex(md, EVP_sha256(), NULL) &&
		 EVP_DigestUpdate(md, hdr, MEM_LAYER_META_OFF) && EVP_DigestUpdate(md, bitmaps, len) &&
		 EVP_DigestFinal_ex(md, out, &n);
	EVP_MD_CTX_free(md);
	return ok && n == 32 ? 0 : -EIO;
}

int snap_crypt_seal_meta(struct snap_crypt *sc, const uint8_t *hdr, const uint8_t *bitmaps,
			 size_t bitmaps_len, uint8_t meta[MEM_LAYER_META_LEN])
{
	uint8_t d[32];
	int r = digest(hdr, bitmaps, bitmaps_len, d);
	if (!r)
		r = crypto_seal_blob(sc->cc, sc->chain_id, "cove-layer-meta", d, sizeof(d), meta);
	return r;
}

int snap_crypt_check_layer(struct snap_crypt *sc, const struct mem_layer *l)
{
	uint8_t hdr[MEM_LAYER_HDR];
	if (pread_full(l->fd, hdr, sizeof(hdr), 0))
		return -EIO;
	uint8_t want[32], got[32];
	if (digest(hdr, (const uint8_t *)l->bitmap, (size_t)l->info.bitmap_len * 2, want))
		return -EIO;
	if (crypto_open_blob(sc->cc, sc->chain_id, "cove-layer-meta", l->info.meta,
			     MEM_LAYER_META_LEN, got))
		return -EBADMSG;
	if (CRYPTO_memcmp(want, got, 32))
		return -EBADMSG;
	/* The salt was in the digest: register the layer's subkey for its pages. */
	return crypto_ctx_add_layer(sc->cc, l->info.layer_id, l->info.salt) ? -EBADMSG : 0;
}

int snap_crypt_new_layer(struct snap_crypt *sc, uint64_t layer_id, uint8_t salt[CRYPTO_SALT_LEN])
{
	int r = crypto_random(salt, CRYPTO_SALT_LEN);
	if (!r)
		r = crypto_ctx_add_layer(sc->cc, layer_id, salt);
	return r;
}

static void state_domain(char *buf, size_t cap, uint64_t layer_id)
{
	snprintf(buf, cap, "cove-state-%llu", (unsigned long long)layer_id);
}

int snap_crypt_seal_state(struct snap_crypt *sc, uint64_t layer_id, const uint8_t *plain,
			  size_t len, uint8_t **out, size_t *out_len)
{
	uint8_t *p = malloc(STATE_ENC_HDR + len + CRYPTO_BLOB_OVERHEAD);
	if (!p)
		return -ENOMEM;
	memcpy(p, STATE_ENC_MAGIC, 8);
	put_le32(p + 8, 1);
	put_le32(p + 12, 0);
	put_le64(p + 16, layer_id);
	char dom[48];
	state_domain(dom, sizeof(dom), layer_id);
	int r = crypto_seal_blob(sc->cc, sc->chain_id, dom, plain, len, p + STATE_ENC_HDR);
	if (r) {
		free(p);
		return r;
	}
	*out = p;
	*out_len = STATE_ENC_HDR + len + CRYPTO_BLOB_OVERHEAD;
	return 0;
}

int snap_state_is_encrypted(const uint8_t *buf, size_t len)
{
	return len >= 8 && !memcmp(buf, STATE_ENC_MAGIC, 8);
}

int snap_crypt_open_state(struct snap_crypt *sc, uint64_t layer_id, const uint8_t *in, size_t len,
			  uint8_t **out, size_t *out_len, char *err, size_t errlen)
{
	if (len < STATE_ENC_HDR + CRYPTO_BLOB_OVERHEAD || !snap_state_is_encrypted(in, len))
		return errmsg(err, errlen, -EINVAL, "encrypted state file is truncated");
	if (get_le32(in + 8) != 1)
		return errmsg(err, errlen, -EINVAL, "encrypted state file version %u is not supported",
			      get_le32(in + 8));
	if (get_le64(in + 16) != layer_id)
		return errmsg(err, errlen, -EINVAL, "encrypted state file belongs to layer %llu",
			      (unsigned long long)get_le64(in + 16));
	size_t plen = len - STATE_ENC_HDR - CRYPTO_BLOB_OVERHEAD;
	uint8_t *p = malloc(plen ? plen : 1);
	if (!p)
		return -ENOMEM;
	char dom[48];
	state_domain(dom, sizeof(dom), layer_id);
	int r = crypto_open_blob(sc->cc, sc->chain_id, dom, in + STATE_ENC_HDR,
				 len - STATE_ENC_HDR, p);
	if (r) {
		free(p);
		return errmsg(err, errlen, -EBADMSG,
			      "state file failed authentication (altered, or not this chain's)");
	}
	*out = p;
	*out_len = plen;
	return 0;
}

static int sealer_seal(void *opaque, const uint8_t chain_id[OVERLAY_CHAIN_ID_LEN],
		       uint64_t layer_id, const uint8_t salt[OVERLAY_SALT_LEN], uint64_t chunk,
		       const void *in, size_t len, void *out, uint8_t tag[OVERLAY_TAG_LEN])
{
	struct snap_sealer *s = opaque;
	pthread_mutex_lock(&s->lock);
	int r = crypto_ctx_add_layer(s->cc, layer_id, salt);
	if (!r)
		r = crypto_seal_page(s->cc, chain_id, layer_id, chunk, in, len, out, tag);
	pthread_mutex_unlock(&s->lock);
	return r;
}

static int sealer_open(void *opaque, const uint8_t chain_id[OVERLAY_CHAIN_ID_LEN],
		       uint64_t layer_id, const uint8_t salt[OVERLAY_SALT_LEN], uint64_t chunk,
		       const void *in, size_t len, void *out, const uint8_t tag[OVERLAY_TAG_LEN])
{
	struct snap_sealer *s = opaque;
	pthread_mutex_lock(&s->lock);
	int r = crypto_ctx_add_layer(s->cc, layer_id, salt);
	if (!r)
		r = crypto_open_page(s->cc, chain_id, layer_id, chunk, in, len, out, tag);
	pthread_mutex_unlock(&s->lock);
	return r == -EINVAL || r == -ERANGE ? -EBADMSG : r;
}

static int map_digest(const uint8_t *hdr, size_t hdr_len, const uint8_t *bm, size_t bm_len,
		      uint8_t out[32])
{
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	unsigned int n = 0;
	int ok = md && EVP_DigestInit_ex(md, EVP_sha256(), NULL) &&
		 EVP_DigestUpdate(md, hdr, hdr_len) && EVP_DigestUpdate(md, bm, bm_len) &&
		 EVP_DigestFinal_ex(md, out, &n);
	EVP_MD_CTX_free(md);
	return ok && n == 32 ? 0 : -EIO;
}

static int sealer_seal_map(void *opaque, const uint8_t chain_id[OVERLAY_CHAIN_ID_LEN],
			   const uint8_t *hdr, size_t hdr_len, const uint8_t *bm, size_t bm_len,
			   uint8_t mac[OVERLAY_MAC_LEN])
{
	struct snap_sealer *s = opaque;
	uint8_t d[32];
	int r = map_digest(hdr, hdr_len, bm, bm_len, d);
	pthread_mutex_lock(&s->lock);
	if (!r)
		r = crypto_seal_blob(s->cc, chain_id, "cove-overlay-map", d, sizeof(d), mac);
	pthread_mutex_unlock(&s->lock);
	return r;
}

static int sealer_check_map(void *opaque, const uint8_t chain_id[OVERLAY_CHAIN_ID_LEN],
			    const uint8_t *hdr, size_t hdr_len, const uint8_t *bm, size_t bm_len,
			    const uint8_t mac[OVERLAY_MAC_LEN])
{
	struct snap_sealer *s = opaque;
	uint8_t want[32], got[32];
	if (map_digest(hdr, hdr_len, bm, bm_len, want))
		return -EIO;
	pthread_mutex_lock(&s->lock);
	int r = crypto_open_blob(s->cc, chain_id, "cove-overlay-map", mac, OVERLAY_MAC_LEN, got);
	pthread_mutex_unlock(&s->lock);
	if (r || CRYPTO_memcmp(want, got, 32))
		return -EBADMSG;
	return 0;
}

int snap_sealer_new(const struct snap_crypt *sc, struct snap_sealer **out)
{
	_Static_assert(CRYPTO_BLOB_OVERHEAD + 32 == OVERLAY_MAC_LEN, "map MAC is a sealed digest");
	_Static_assert(CRYPTO_SALT_LEN == OVERLAY_SALT_LEN && CRYPTO_TAG_LEN == OVERLAY_TAG_LEN &&
			   CRYPTO_CHAIN_ID_LEN == OVERLAY_CHAIN_ID_LEN,
		       "overlay sealing sizes");
	struct snap_sealer *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	int r = crypto_ctx_new(sc->key, &s->cc);
	if (r) {
		free(s);
		return r;
	}
	memcpy(s->chain_id, sc->chain_id, sizeof(s->chain_id));
	pthread_mutex_init(&s->lock, NULL);
	s->ops = (struct overlay_sealer){.opaque = s,
					 .seal = sealer_seal,
					 .open = sealer_open,
					 .seal_map = sealer_seal_map,
					 .check_map = sealer_check_map};
	memcpy(s->ops.chain_id, sc->chain_id, sizeof(s->ops.chain_id));
	*out = s;
	return 0;
}

void snap_sealer_free(struct snap_sealer *s)
{
	if (!s)
		return;
	crypto_ctx_free(s->cc);
	pthread_mutex_destroy(&s->lock);
	free(s);
}
