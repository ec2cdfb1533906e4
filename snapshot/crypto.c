/* AES-256-GCM over OpenSSL 3 EVP for snapshot pages and blobs; locked data keys. */
#include "snapshot/crypto.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#define PAGE_AAD_LABEL "cove-page-v1"
#define BLOB_AAD_LABEL "cove-blob-v1"
#define LABEL_LEN      12
#define BLOB_LAYER     0xffffffffu
#define DOMAIN_MAX     255
#define LAYER_KDF_INFO "cove-layer-key-v2"
#define CTX_LAYERS_MAX 1024 /* beyond this the oldest layer is forgotten (writers move on) */

struct snap_key {
	uint8_t bytes[CRYPTO_KEY_LEN];
	size_t alloc; /* the whole page this struct sits at the start of */
	int locked;
};

/* A layer's subkey, keyed once in both directions. */
struct layer_ctx {
	uint64_t layer_id;
	uint8_t salt[CRYPTO_SALT_LEN];
	EVP_CIPHER_CTX *enc;
	EVP_CIPHER_CTX *dec;
};

struct crypto_ctx {
	EVP_CIPHER_CTX *enc; /* the data key: blobs */
	EVP_CIPHER_CTX *dec;
	struct snap_key *dk; /* a locked copy of the data key, for layer subkeys */
	struct layer_ctx *layers;
	size_t nr_layers, cap_layers;
	size_t last; /* the entry the previous page used */
};

void crypto_cleanse(void *buf, size_t len)
{
	if (buf && len)
		OPENSSL_cleanse(buf, len);
}

int crypto_random(void *buf, size_t len)
{
	if (len > (size_t)INT32_MAX)
		return -EINVAL;
	return RAND_bytes(buf, (int)len) == 1 ? 0 : -EIO;
}

/* A page of its own, so mlock and MADV_DONTDUMP cover nothing else. */
static int key_alloc(struct snap_key **out)
{
	long pg = sysconf(_SC_PAGESIZE);
	size_t alloc = pg > 0 ? (size_t)pg : 4096;
	void *p = mmap(NULL, alloc, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return -errno;
	struct snap_key *k = p;
	k->alloc = alloc;
	k->locked = mlock(p, alloc) == 0;
	(void)madvise(p, alloc, MADV_DONTDUMP); /* best effort: keep keys out of core dumps */
	*out = k;
	return 0;
}

void crypto_key_free(struct snap_key *key)
{
	if (!key)
		return;
	size_t alloc = key->alloc;
	int locked = key->locked;
	OPENSSL_cleanse(key, alloc);
	if (locked)
		munlock(key, alloc);
	munmap(key, alloc);
}

int crypto_key_generate(struct snap_key **out)
{
	struct snap_key *k;
	int r = key_alloc(&k);
	if (r)
		return r;
	if (RAND_priv_bytes(k->bytes, CRYPTO_KEY_LEN) != 1) {
		crypto_key_free(k);
		return -EIO;
	}
	*out = k;
	return 0;
}

int crypto_key_import(const uint8_t raw[CRYPTO_KEY_LEN], struct snap_key **out)
{
	struct snap_key *k;
	int r = key_alloc(&k);
	if (r)
		return r;
	memcpy(k->bytes, raw, CRYPTO_KEY_LEN);
	*out = k;
	return 0;
}

const uint8_t *crypto_key_bytes(const struct snap_key *key)
{
	return key->bytes;
}

int crypto_key_locked(const struct snap_key *key)
{
	return key->locked;
}

void crypto_ctx_free(struct crypto_ctx *cc)
{
	if (!cc)
		return;
	EVP_CIPHER_CTX_free(cc->enc);
	EVP_CIPHER_CTX_free(cc->dec);
	for (size_t i = 0; i < cc->nr_layers; i++) {
		EVP_CIPHER_CTX_free(cc->layers[i].enc);
		EVP_CIPHER_CTX_free(cc->layers[i].dec);
	}
	free(cc->layers);
	crypto_key_free(cc->dk);
	free(cc);
}

/* Key both directions once; per page only the IV changes, so the key schedule is reused. */
static int key_pair(const uint8_t *key, EVP_CIPHER_CTX **enc, EVP_CIPHER_CTX **dec)
{
	EVP_CIPHER *aes = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL);
	if (!aes)
		return -EIO;
	*enc = EVP_CIPHER_CTX_new();
	*dec = EVP_CIPHER_CTX_new();
	int ok = *enc && *dec && EVP_EncryptInit_ex2(*enc, aes, key, NULL, NULL) == 1 &&
		 EVP_DecryptInit_ex2(*dec, aes, key, NULL, NULL) == 1;
	EVP_CIPHER_free(aes);
	if (ok)
		return 0;
	EVP_CIPHER_CTX_free(*enc);
	EVP_CIPHER_CTX_free(*dec);
	*enc = *dec = NULL;
	return -EIO;
}

int crypto_ctx_new(const struct snap_key *key, struct crypto_ctx **out)
{
	struct crypto_ctx *cc = calloc(1, sizeof(*cc));
	if (!cc)
		return -ENOMEM;
	int r = crypto_key_import(key->bytes, &cc->dk);
	if (!r)
		r = key_pair(key->bytes, &cc->enc, &cc->dec);
	if (r) {
		crypto_ctx_free(cc);
		return r;
	}
	*out = cc;
	return 0;
}

static void put_le64(uint8_t *p, uint64_t v);

int crypto_layer_key(const struct snap_key *key, uint64_t layer_id,
		     const uint8_t salt[CRYPTO_SALT_LEN], uint8_t out[CRYPTO_KEY_LEN])
{
	uint8_t info[sizeof(LAYER_KDF_INFO) - 1 + 8];
	memcpy(info, LAYER_KDF_INFO, sizeof(LAYER_KDF_INFO) - 1);
	put_le64(info + sizeof(LAYER_KDF_INFO) - 1, layer_id);
	EVP_KDF *kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
	EVP_KDF_CTX *kc = kdf ? EVP_KDF_CTX_new(kdf) : NULL;
	EVP_KDF_free(kdf);
	if (!kc)
		return -EIO;
	OSSL_PARAM params[] = {
	    OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)"SHA256", 0),
	    OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)key->bytes,
					      CRYPTO_KEY_LEN),
	    OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, (void *)salt, CRYPTO_SALT_LEN),
	    OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info, sizeof(info)),
	    OSSL_PARAM_construct_end(),
	};
	int ok = EVP_KDF_derive(kc, out, CRYPTO_KEY_LEN, params) == 1;
	EVP_KDF_CTX_free(kc);
	return ok ? 0 : -EIO;
}

int crypto_ctx_add_layer(struct crypto_ctx *cc, uint64_t layer_id,
			 const uint8_t salt[CRYPTO_SALT_LEN])
{
	static const uint8_t zero[CRYPTO_SALT_LEN];
	if (layer_id > CRYPTO_LAYER_MAX)
		return -ERANGE;
	/* An all-zero salt is what a layer written before salts existed holds: never accept it. */
	if (!memcmp(salt, zero, CRYPTO_SALT_LEN))
		return -EINVAL;
	/* Known (id, salt): it becomes the one pages of this id use. */
	for (size_t i = 0; i < cc->nr_layers; i++)
		if (cc->layers[i].layer_id == layer_id &&
		    !memcmp(cc->layers[i].salt, salt, CRYPTO_SALT_LEN)) {
			cc->last = i;
			return 0;
		}
	struct layer_ctx *e = NULL;
	uint8_t sub[CRYPTO_KEY_LEN];
	EVP_CIPHER_CTX *enc, *dec;
	int r = crypto_layer_key(cc->dk, layer_id, salt, sub);
	if (!r)
		r = key_pair(sub, &enc, &dec);
	OPENSSL_cleanse(sub, sizeof(sub));
	if (r)
		return r;
	if (cc->nr_layers == CTX_LAYERS_MAX) {
		/* Forget the oldest: a writer never seals under an old layer id again. */
		EVP_CIPHER_CTX_free(cc->layers[0].enc);
		EVP_CIPHER_CTX_free(cc->layers[0].dec);
		memmove(cc->layers, cc->layers + 1, (cc->nr_layers - 1) * sizeof(*cc->layers));
		cc->nr_layers--;
	}
	if (cc->nr_layers == cc->cap_layers) {
		size_t cap = cc->cap_layers ? cc->cap_layers * 2 : 16;
		struct layer_ctx *n = realloc(cc->layers, cap * sizeof(*n));
		if (!n) {
			EVP_CIPHER_CTX_free(enc);
			EVP_CIPHER_CTX_free(dec);
			return -ENOMEM;
		}
		cc->layers = n;
		cc->cap_layers = cap;
	}
	e = &cc->layers[cc->nr_layers++];
	e->layer_id = layer_id;
	memcpy(e->salt, salt, CRYPTO_SALT_LEN);
	e->enc = enc;
	e->dec = dec;
	cc->last = (size_t)(e - cc->layers);
	return 0;
}

int crypto_ctx_dup(const struct crypto_ctx *cc, struct crypto_ctx **out)
{
	struct crypto_ctx *n = NULL;
	int r = crypto_ctx_new(cc->dk, &n);
	if (r)
		return r;
	for (size_t i = 0; !r && i < cc->nr_layers; i++)
		r = crypto_ctx_add_layer(n, cc->layers[i].layer_id, cc->layers[i].salt);
	if (r) {
		crypto_ctx_free(n);
		return r;
	}
	*out = n;
	return 0;
}

/* The registered layer's contexts, or NULL: pages are never sealed under the data key itself. */
static struct layer_ctx *layer_of(struct crypto_ctx *cc, uint64_t layer_id)
{
	if (cc->last < cc->nr_layers && cc->layers[cc->last].layer_id == layer_id)
		return &cc->layers[cc->last];
	for (size_t i = cc->nr_layers; i-- > 0;)
		if (cc->layers[i].layer_id == layer_id) {
			cc->last = i;
			return &cc->layers[i];
		}
	return NULL;
}

static void put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static void put_be64(uint8_t *p, uint64_t v)
{
	put_be32(p, (uint32_t)(v >> 32));
	put_be32(p + 4, (uint32_t)v);
}

static void put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

int crypto_page_nonce(uint64_t layer_id, uint64_t index, uint8_t nonce[CRYPTO_NONCE_LEN])
{
	if (layer_id > CRYPTO_LAYER_MAX)
		return -ERANGE;
	put_be32(nonce, (uint32_t)layer_id);
	put_be64(nonce + 4, index);
	return 0;
}

#define PAGE_AAD_LEN (LABEL_LEN + CRYPTO_CHAIN_ID_LEN + 8 + 8 + 8)

static void page_aad(uint8_t aad[PAGE_AAD_LEN], const uint8_t *chain_id, uint64_t layer_id,
		     uint64_t index, size_t len)
{
	memcpy(aad, PAGE_AAD_LABEL, LABEL_LEN);
	memcpy(aad + LABEL_LEN, chain_id, CRYPTO_CHAIN_ID_LEN);
	put_le64(aad + LABEL_LEN + CRYPTO_CHAIN_ID_LEN, layer_id);
	put_le64(aad + LABEL_LEN + CRYPTO_CHAIN_ID_LEN + 8, index);
	put_le64(aad + LABEL_LEN + CRYPTO_CHAIN_ID_LEN + 16, len);
}

/* One GCM encryption with the context's key; len fits an int (checked by callers). */
static int gcm_seal(EVP_CIPHER_CTX *c, const uint8_t *nonce, const uint8_t *aad, size_t aad_len,
		    const void *in, size_t len, void *out, uint8_t *tag)
{
	int n;
	if (EVP_EncryptInit_ex2(c, NULL, NULL, nonce, NULL) != 1 ||
	    EVP_EncryptUpdate(c, NULL, &n, aad, (int)aad_len) != 1)
		return -EIO;
	if (len && EVP_EncryptUpdate(c, out, &n, in, (int)len) != 1)
		return -EIO;
	if (EVP_EncryptFinal_ex(c, (uint8_t *)out + len, &n) != 1 ||
	    EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, CRYPTO_TAG_LEN, tag) != 1)
		return -EIO;
	return 0;
}

static int gcm_open(EVP_CIPHER_CTX *c, const uint8_t *nonce, const uint8_t *aad, size_t aad_len,
		    const void *in, size_t len, void *out, const uint8_t *tag)
{
	int n;
	uint8_t t[CRYPTO_TAG_LEN];
	memcpy(t, tag, sizeof(t)); /* the ctrl takes a non-const pointer */
	if (EVP_DecryptInit_ex2(c, NULL, NULL, nonce, NULL) != 1 ||
	    EVP_DecryptUpdate(c, NULL, &n, aad, (int)aad_len) != 1)
		return -EIO;
	if (len && EVP_DecryptUpdate(c, out, &n, in, (int)len) != 1)
		return -EIO;
	if (EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, CRYPTO_TAG_LEN, t) != 1)
		return -EIO;
	if (EVP_DecryptFinal_ex(c, (uint8_t *)out + len, &n) != 1) {
		if (len)
			OPENSSL_cleanse(out, len);
		return -EBADMSG;
	}
	return 0;
}

/* What sealing and opening page `index` of `layer_id` share: length check, nonce, AAD, key. */
static int page_setup(struct crypto_ctx *cc, const uint8_t chain_id[CRYPTO_CHAIN_ID_LEN],
		      uint64_t layer_id, uint64_t index, size_t len,
		      uint8_t nonce[CRYPTO_NONCE_LEN], uint8_t aad[PAGE_AAD_LEN],
		      struct layer_ctx **l)
{
	if (len == 0 || len > CRYPTO_PAGE_MAX_LEN)
		return -EINVAL;
	int r = crypto_page_nonce(layer_id, index, nonce);
	if (r)
		return r;
	*l = layer_of(cc, layer_id);
	if (!*l)
		return -ENOKEY;
	page_aad(aad, chain_id, layer_id, index, len);
	return 0;
}

int crypto_seal_page(struct crypto_ctx *cc, const uint8_t chain_id[CRYPTO_CHAIN_ID_LEN],
		     uint64_t layer_id, uint64_t index, const void *plain, size_t len, void *out,
		     uint8_t tag[CRYPTO_TAG_LEN])
{
	uint8_t nonce[CRYPTO_NONCE_LEN], aad[PAGE_AAD_LEN];
	struct layer_ctx *l;
	int r = page_setup(cc, chain_id, layer_id, index, len, nonce, aad, &l);
	if (r)
		return r;
	return gcm_seal(l->enc, nonce, aad, sizeof(aad), plain, len, out, tag);
}

int crypto_open_page(struct crypto_ctx *cc, const uint8_t chain_id[CRYPTO_CHAIN_ID_LEN],
		     uint64_t layer_id, uint64_t index, const void *cipher, size_t len, void *out,
		     const uint8_t tag[CRYPTO_TAG_LEN])
{
	uint8_t nonce[CRYPTO_NONCE_LEN], aad[PAGE_AAD_LEN];
	struct layer_ctx *l;
	int r = page_setup(cc, chain_id, layer_id, index, len, nonce, aad, &l);
	if (r == -ENOKEY)
		memset(out, 0, len);
	if (r)
		return r;
	return gcm_open(l->dec, nonce, aad, sizeof(aad), cipher, len, out, tag);
}

/* "cove-blob-v1" || chain_id || domain length (1 byte) || domain || plaintext length (u64 LE) */
static int blob_aad(uint8_t *aad, size_t *aad_len, const uint8_t *chain_id, const char *domain,
		    size_t len)
{
	size_t dl = domain ? strlen(domain) : 0;
	if (dl > DOMAIN_MAX)
		return -EINVAL;
	size_t o = 0;
	memcpy(aad, BLOB_AAD_LABEL, LABEL_LEN);
	o += LABEL_LEN;
	memcpy(aad + o, chain_id, CRYPTO_CHAIN_ID_LEN);
	o += CRYPTO_CHAIN_ID_LEN;
	aad[o++] = (uint8_t)dl;
	if (dl)
		memcpy(aad + o, domain, dl);
	o += dl;
	put_le64(aad + o, len);
	*aad_len = o + 8;
	return 0;
}

#define BLOB_AAD_MAX (LABEL_LEN + CRYPTO_CHAIN_ID_LEN + 1 + DOMAIN_MAX + 8)

int crypto_seal_blob(struct crypto_ctx *cc, const uint8_t chain_id[CRYPTO_CHAIN_ID_LEN],
		     const char *domain, const void *plain, size_t len, void *out)
{
	uint8_t aad[BLOB_AAD_MAX];
	size_t aad_len;
	uint8_t *o = out;
	if (len > CRYPTO_BLOB_MAX_LEN)
		return -EINVAL;
	int r = blob_aad(aad, &aad_len, chain_id, domain, len);
	if (r)
		return r;
	put_be32(o, BLOB_LAYER);
	if (RAND_bytes(o + 4, CRYPTO_NONCE_LEN - 4) != 1)
		return -EIO;
	return gcm_seal(cc->enc, o, aad, aad_len, plain, len, o + CRYPTO_NONCE_LEN,
			o + CRYPTO_NONCE_LEN + len);
}

int crypto_open_blob(struct crypto_ctx *cc, const uint8_t chain_id[CRYPTO_CHAIN_ID_LEN],
		     const char *domain, const void *in, size_t in_len, void *out)
{
	uint8_t aad[BLOB_AAD_MAX];
	size_t aad_len;
	const uint8_t *i = in;
	if (in_len < CRYPTO_BLOB_OVERHEAD)
		return -EBADMSG;
	size_t len = in_len - CRYPTO_BLOB_OVERHEAD;
	if (len > CRYPTO_BLOB_MAX_LEN)
		return -EINVAL;
	/* A blob nonce always starts with the reserved layer: anything else is not a blob. */
	if (i[0] != 0xff || i[1] != 0xff || i[2] != 0xff || i[3] != 0xff)
		return -EBADMSG;
	int r = blob_aad(aad, &aad_len, chain_id, domain, len);
	if (r)
		return r;
	return gcm_open(cc->dec, i, aad, aad_len, i + CRYPTO_NONCE_LEN, len, out,
			i + CRYPTO_NONCE_LEN + len);
}
