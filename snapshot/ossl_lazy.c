/*
 * libcrypto on first use, for cove-vmm and cove: each OpenSSL function they call is
 * defined here and forwards to libcrypto, which is dlopen'ed when the first one runs (an
 * encrypted chain, a key provider). A VMM whose chain is not encrypted never maps libcrypto:
 * 1.4 MiB of RSS, mostly its relocations (README, "The VMM process"). Linked into the two
 * executables only, never into the snapshot library: the tests link libcrypto itself.
 * These definitions are not exported (nothing else linked references them), so libcrypto's own
 * calls never land here. Failing to load, each returns OpenSSL's failure value.
 */
#include <dlfcn.h>
#include <stdatomic.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>

_Static_assert(OPENSSL_VERSION_MAJOR == 3, "ossl_lazy.c loads libcrypto.so.3");
#define OSSL_LAZY_SONAME "libcrypto.so.3"

static void *ossl_sym(const char *name)
{
	/* dlopen counts references and returns the same handle: nothing to remember here. */
	void *h = dlopen(OSSL_LAZY_SONAME, RTLD_NOW | RTLD_LOCAL);

	return h ? dlsym(h, name) : NULL;
}

/* The resolved pointer is kept per function, like a PLT slot. */
#define OSSL_LAZY(ret, fail, name, params, args)                                                   \
	ret name params                                                                            \
	{                                                                                          \
		static _Atomic(__typeof__(&name)) slot;                                            \
		__typeof__(&name) fn = atomic_load_explicit(&slot, memory_order_acquire);          \
		if (!fn) {                                                                         \
			fn = (__typeof__(&name))ossl_sym(#name);                                   \
			if (!fn)                                                                   \
				return fail;                                                       \
			atomic_store_explicit(&slot, fn, memory_order_release);                    \
		}                                                                                  \
		return fn args;                                                                    \
	}

#define OSSL_LAZY_VOID(name, params, args)                                                         \
	void name params                                                                           \
	{                                                                                          \
		static _Atomic(__typeof__(&name)) slot;                                            \
		__typeof__(&name) fn = atomic_load_explicit(&slot, memory_order_acquire);          \
		if (!fn) {                                                                         \
			fn = (__typeof__(&name))ossl_sym(#name);                                   \
			if (!fn)                                                                   \
				return;                                                            \
			atomic_store_explicit(&slot, fn, memory_order_release);                    \
		}                                                                                  \
		fn args;                                                                           \
	}

static const OSSL_PARAM ossl_param_end; /* all zero: what OSSL_PARAM_construct_end returns */

/* Unequal when libcrypto is missing: a MAC never checks out without it. */
OSSL_LAZY(int, 1, CRYPTO_memcmp, (const void *a, const void *b, size_t len), (a, b, len))
OSSL_LAZY(int, 0, RAND_bytes, (unsigned char *buf, int num), (buf, num))
OSSL_LAZY(int, 0, RAND_priv_bytes, (unsigned char *buf, int num), (buf, num))
OSSL_LAZY(EVP_CIPHER_CTX *, NULL, EVP_CIPHER_CTX_new, (void), ())
OSSL_LAZY_VOID(EVP_CIPHER_CTX_free, (EVP_CIPHER_CTX * c), (c))
OSSL_LAZY(int, 0, EVP_CIPHER_CTX_ctrl, (EVP_CIPHER_CTX * ctx, int type, int arg, void *ptr),
	  (ctx, type, arg, ptr))
OSSL_LAZY(EVP_CIPHER *, NULL, EVP_CIPHER_fetch,
	  (OSSL_LIB_CTX * ctx, const char *algorithm, const char *properties),
	  (ctx, algorithm, properties))
OSSL_LAZY_VOID(EVP_CIPHER_free, (EVP_CIPHER * cipher), (cipher))
OSSL_LAZY(int, 0, EVP_EncryptInit_ex2,
	  (EVP_CIPHER_CTX * ctx, const EVP_CIPHER *cipher, const unsigned char *key,
	   const unsigned char *iv, const OSSL_PARAM params[]),
	  (ctx, cipher, key, iv, params))
OSSL_LAZY(int, 0, EVP_EncryptUpdate,
	  (EVP_CIPHER_CTX * ctx, unsigned char *out, int *outl, const unsigned char *in, int inl),
	  (ctx, out, outl, in, inl))
OSSL_LAZY(int, 0, EVP_EncryptFinal_ex, (EVP_CIPHER_CTX * ctx, unsigned char *out, int *outl),
	  (ctx, out, outl))
OSSL_LAZY(int, 0, EVP_DecryptInit_ex2,
	  (EVP_CIPHER_CTX * ctx, const EVP_CIPHER *cipher, const unsigned char *key,
	   const unsigned char *iv, const OSSL_PARAM params[]),
	  (ctx, cipher, key, iv, params))
OSSL_LAZY(int, 0, EVP_DecryptUpdate,
	  (EVP_CIPHER_CTX * ctx, unsigned char *out, int *outl, const unsigned char *in, int inl),
	  (ctx, out, outl, in, inl))
OSSL_LAZY(int, 0, EVP_DecryptFinal_ex, (EVP_CIPHER_CTX * ctx, unsigned char *outm, int *outl),
	  (ctx, outm, outl))
OSSL_LAZY(EVP_MD_CTX *, NULL, EVP_MD_CTX_new, (void), ())
OSSL_LAZY_VOID(EVP_MD_CTX_free, (EVP_MD_CTX * ctx), (ctx))
OSSL_LAZY(const EVP_MD *, NULL, EVP_sha256, (void), ())
OSSL_LAZY(int, 0, EVP_DigestInit_ex, (EVP_MD_CTX * ctx, const EVP_MD *type, ENGINE *impl),
	  (ctx, type, impl))
OSSL_LAZY(int, 0, EVP_DigestUpdate, (EVP_MD_CTX * ctx, const void *d, size_t cnt), (ctx, d, cnt))
OSSL_LAZY(int, 0, EVP_DigestFinal_ex, (EVP_MD_CTX * ctx, unsigned char *md, unsigned int *s),
	  (ctx, md, s))
OSSL_LAZY(unsigned char *, NULL, HMAC,
	  (const EVP_MD *evp_md, const void *key, int key_len, const unsigned char *data,
	   size_t data_len, unsigned char *md, unsigned int *md_len),
	  (evp_md, key, key_len, data, data_len, md, md_len))
OSSL_LAZY(int, -1, EVP_EncodeBlock, (unsigned char *t, const unsigned char *f, int n), (t, f, n))
OSSL_LAZY(int, -1, EVP_DecodeBlock, (unsigned char *t, const unsigned char *f, int n), (t, f, n))
OSSL_LAZY(EVP_KDF *, NULL, EVP_KDF_fetch,
	  (OSSL_LIB_CTX * libctx, const char *algorithm, const char *properties),
	  (libctx, algorithm, properties))
OSSL_LAZY_VOID(EVP_KDF_free, (EVP_KDF * kdf), (kdf))
OSSL_LAZY(EVP_KDF_CTX *, NULL, EVP_KDF_CTX_new, (EVP_KDF * kdf), (kdf))
OSSL_LAZY_VOID(EVP_KDF_CTX_free, (EVP_KDF_CTX * ctx), (ctx))
OSSL_LAZY(int, 0, EVP_KDF_derive,
	  (EVP_KDF_CTX * ctx, unsigned char *key, size_t keylen, const OSSL_PARAM params[]),
	  (ctx, key, keylen, params))
OSSL_LAZY(OSSL_PARAM, ossl_param_end, OSSL_PARAM_construct_end, (void), ())
OSSL_LAZY(OSSL_PARAM, ossl_param_end, OSSL_PARAM_construct_octet_string,
	  (const char *key, void *buf, size_t bsize), (key, buf, bsize))
OSSL_LAZY(OSSL_PARAM, ossl_param_end, OSSL_PARAM_construct_utf8_string,
	  (const char *key, char *buf, size_t bsize), (key, buf, bsize))

/* Key material is wiped even when libcrypto cannot be loaded. */
void OPENSSL_cleanse(void *ptr, size_t len)
{
	static _Atomic(__typeof__(&OPENSSL_cleanse)) slot;
	__typeof__(&OPENSSL_cleanse) fn = atomic_load_explicit(&slot, memory_order_acquire);

	if (!fn) {
		fn = (__typeof__(&OPENSSL_cleanse))ossl_sym("OPENSSL_cleanse");
		if (!fn) {
			explicit_bzero(ptr, len);
			return;
		}
		atomic_store_explicit(&slot, fn, memory_order_release);
	}
	fn(ptr, len);
}
