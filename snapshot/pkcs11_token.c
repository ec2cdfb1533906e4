/*
 * The PKCS#11 token side of the pkcs11 key provider: loads the module (dlopen), logs in, and wraps
 * or unwraps the data key with AES-GCM inside the token. Linked only into cove-pkcs11, the helper
 * process keyprov_pkcs11.c starts, so no module (softhsm2 is C++) is loaded into cove itself.
 */
#include "snapshot/pkcs11_token.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <p11-kit-1/p11-kit/pkcs11.h> /* p11-kit's header; its directory is not on our path */

#include "common/errmsg.h"
#include "snapshot/crypto.h"
#include "snapshot/keyprov.h"

#define WRAP_VERSION 1
#define IV_LEN	     12
#define TAG_LEN	     16
#define WRAP_AAD     "cove-dk-v1"
#define PIN_MAX	     256

/* A wrapped key as stored: version (1) || IV (12) || ciphertext || tag (16). */
#define WRAP_OVERHEAD (1 + IV_LEN + TAG_LEN)

struct p11 {
	void *dl;
	CK_FUNCTION_LIST_PTR f;
	int finalize;
	CK_SESSION_HANDLE session;
	int session_open, logged_in;
};

static const char *rv_name(CK_RV rv)
{
	switch (rv) {
	case CKR_OK:
		return "CKR_OK";
	case CKR_PIN_INCORRECT:
		return "CKR_PIN_INCORRECT";
	case CKR_PIN_LOCKED:
		return "CKR_PIN_LOCKED";
	case CKR_KEY_HANDLE_INVALID:
		return "CKR_KEY_HANDLE_INVALID";
	case CKR_OBJECT_HANDLE_INVALID:
		return "CKR_OBJECT_HANDLE_INVALID";
	case CKR_KEY_FUNCTION_NOT_PERMITTED:
		return "CKR_KEY_FUNCTION_NOT_PERMITTED";
	case CKR_MECHANISM_INVALID:
		return "CKR_MECHANISM_INVALID";
	case CKR_MECHANISM_PARAM_INVALID:
		return "CKR_MECHANISM_PARAM_INVALID";
	case CKR_ENCRYPTED_DATA_INVALID:
		return "CKR_ENCRYPTED_DATA_INVALID";
	case CKR_ENCRYPTED_DATA_LEN_RANGE:
		return "CKR_ENCRYPTED_DATA_LEN_RANGE";
	case CKR_GENERAL_ERROR:
		return "CKR_GENERAL_ERROR";
	case CKR_FUNCTION_FAILED:
		return "CKR_FUNCTION_FAILED";
	case CKR_TOKEN_NOT_PRESENT:
		return "CKR_TOKEN_NOT_PRESENT";
	case CKR_USER_NOT_LOGGED_IN:
		return "CKR_USER_NOT_LOGGED_IN";
	case CKR_BUFFER_TOO_SMALL:
		return "CKR_BUFFER_TOO_SMALL";
	}
	return "CKR_?";
}

/* The PIN: $COVE_PKCS11_PIN, else the first line of pin-file. */
static int read_pin(const struct p11_conf *c, char *pin, size_t cap, char *err, size_t errlen)
{
	const char *env = getenv("COVE_PKCS11_PIN");
	if (env && *env) {
		if (strlen(env) >= cap)
			return errmsg(err, errlen, -EINVAL, "COVE_PKCS11_PIN is too long");
		snprintf(pin, cap, "%s", env);
		return 0;
	}
	if (!c->pin_file[0])
		return errmsg(err, errlen, -EACCES,
			      "no PKCS#11 PIN: set COVE_PKCS11_PIN or pin-file=PATH in the config");
	FILE *f = fopen(c->pin_file, "re");
	if (!f)
		return errmsg(err, errlen, -errno, "cannot read PIN file %s: %s", c->pin_file,
			      strerror(errno));
	if (!fgets(pin, (int)cap, f))
		pin[0] = 0;
	fclose(f);
	pin[strcspn(pin, "\r\n")] = 0;
	if (!pin[0])
		return errmsg(err, errlen, -EINVAL, "PIN file %s is empty", c->pin_file);
	return 0;
}

static void p11_close(struct p11 *p)
{
	if (p->logged_in)
		p->f->C_Logout(p->session);
	if (p->session_open)
		p->f->C_CloseSession(p->session);
	if (p->finalize)
		p->f->C_Finalize(NULL);
	if (p->dl)
		dlclose(p->dl);
	memset(p, 0, sizeof(*p));
}

/* Load the module, find the token by label, open a session, log in. */
static int p11_open(const struct p11_conf *c, struct p11 *p, char *err, size_t errlen)
{
	char pin[PIN_MAX];
	CK_SLOT_ID slots[64];
	CK_ULONG nslots = 64;
	int r;
	memset(p, 0, sizeof(*p));
	p->dl = dlopen(c->module, RTLD_NOW | RTLD_LOCAL);
	if (!p->dl)
		return errmsg(err, errlen, -ENOENT, "cannot load PKCS#11 module %s: %s", c->module,
			      dlerror());
	CK_C_GetFunctionList gfl = (CK_C_GetFunctionList)dlsym(p->dl, "C_GetFunctionList");
	if (!gfl || gfl(&p->f) != CKR_OK || !p->f) {
		r = errmsg(err, errlen, -ENOENT, "%s is not a PKCS#11 module", c->module);
		goto fail;
	}
	CK_C_INITIALIZE_ARGS args = {.flags = CKF_OS_LOCKING_OK};
	CK_RV rv = p->f->C_Initialize(&args);
	if (rv != CKR_OK && rv != CKR_CRYPTOKI_ALREADY_INITIALIZED) {
		r = errmsg(err, errlen, -EIO, "PKCS#11 C_Initialize: %s (0x%lx)", rv_name(rv), rv);
		goto fail;
	}
	p->finalize = rv == CKR_OK; /* someone else in this process owns it otherwise */
	rv = p->f->C_GetSlotList(CK_TRUE, slots, &nslots);
	if (rv != CKR_OK) {
		r = errmsg(err, errlen, -EIO, "PKCS#11 C_GetSlotList: %s (0x%lx)", rv_name(rv), rv);
		goto fail;
	}
	CK_SLOT_ID slot = 0;
	int found = 0;
	for (CK_ULONG i = 0; i < nslots && !found; i++) {
		CK_TOKEN_INFO ti;
		if (p->f->C_GetTokenInfo(slots[i], &ti) != CKR_OK)
			continue;
		char label[33];
		memcpy(label, ti.label, 32);
		label[32] = 0;
		for (int j = 31; j >= 0 && label[j] == ' '; j--)
			label[j] = 0;
		if (strcmp(label, c->token) == 0) {
			slot = slots[i];
			found = 1;
		}
	}
	if (!found) {
		r = errmsg(err, errlen, -EKEYREJECTED, "no PKCS#11 token labelled '%s' in %s",
			   c->token, c->module);
		goto fail;
	}
	rv = p->f->C_OpenSession(slot, CKF_SERIAL_SESSION, NULL, NULL, &p->session);
	if (rv != CKR_OK) {
		r = errmsg(err, errlen, -EIO, "PKCS#11 C_OpenSession on token '%s': %s (0x%lx)",
			   c->token, rv_name(rv), rv);
		goto fail;
	}
	p->session_open = 1;
	r = read_pin(c, pin, sizeof(pin), err, errlen);
	if (r)
		goto fail;
	rv = p->f->C_Login(p->session, CKU_USER, (CK_UTF8CHAR_PTR)pin, strlen(pin));
	crypto_cleanse(pin, sizeof(pin));
	if (rv != CKR_OK && rv != CKR_USER_ALREADY_LOGGED_IN) {
		r = errmsg(err, errlen, -EACCES, "PKCS#11 login to token '%s' failed: %s (0x%lx)",
			   c->token, rv_name(rv), rv);
		goto fail;
	}
	p->logged_in = rv == CKR_OK;
	return 0;
fail:
	crypto_cleanse(pin, sizeof(pin));
	p11_close(p);
	return r;
}

/* The one AES secret key labelled object; a missing key is a refusal (deleted = revoked). */
static int find_key(struct p11 *p, const struct p11_conf *c, CK_OBJECT_HANDLE *key, char *err,
		    size_t errlen)
{
	CK_OBJECT_CLASS cls = CKO_SECRET_KEY;
	CK_KEY_TYPE kt = CKK_AES;
	CK_ATTRIBUTE tmpl[] = {
	    {CKA_CLASS, &cls, sizeof(cls)},
	    {CKA_KEY_TYPE, &kt, sizeof(kt)},
	    {CKA_LABEL, (void *)c->object, strlen(c->object)},
	};
	CK_OBJECT_HANDLE h[2];
	CK_ULONG n = 0;
	CK_RV rv = p->f->C_FindObjectsInit(p->session, tmpl, 3);
	if (rv != CKR_OK)
		return errmsg(err, errlen, -EIO, "PKCS#11 C_FindObjectsInit: %s (0x%lx)",
			      rv_name(rv), rv);
	rv = p->f->C_FindObjects(p->session, h, 2, &n);
	p->f->C_FindObjectsFinal(p->session);
	if (rv != CKR_OK)
		return errmsg(err, errlen, -EIO, "PKCS#11 C_FindObjects: %s (0x%lx)", rv_name(rv),
			      rv);
	if (n == 0)
		return errmsg(err, errlen, -EKEYREJECTED,
			      "no AES key object labelled '%s' on token '%s'", c->object, c->token);
	if (n > 1)
		return errmsg(err, errlen, -EINVAL,
			      "more than one AES key object labelled '%s' on token '%s'", c->object,
			      c->token);
	*key = h[0];
	return 0;
}

/* The AES-GCM parameters of a wrap: `iv`, the fixed AAD and a full tag. */
static CK_GCM_PARAMS gcm_params(uint8_t *iv)
{
	return (CK_GCM_PARAMS){
	    .pIv = iv,
	    .ulIvLen = IV_LEN,
	    .ulIvBits = IV_LEN * 8,
	    .pAAD = (CK_BYTE_PTR)WRAP_AAD,
	    .ulAADLen = sizeof(WRAP_AAD) - 1,
	    .ulTagBits = TAG_LEN * 8,
	};
}

static int do_wrap(struct p11 *p, CK_OBJECT_HANDLE key, const uint8_t *in, size_t in_len,
		   uint8_t *out, size_t cap, size_t *out_len, char *err, size_t errlen)
{
	if (cap < in_len + WRAP_OVERHEAD)
		return errmsg(err, errlen, -EMSGSIZE, "pkcs11: wrap buffer too small");
	out[0] = WRAP_VERSION;
	uint8_t *iv = out + 1;
	if (crypto_random(iv, IV_LEN))
		return errmsg(err, errlen, -EIO, "pkcs11: no random bytes for the IV");
	CK_GCM_PARAMS gcm = gcm_params(iv);
	CK_MECHANISM mech = {CKM_AES_GCM, &gcm, sizeof(gcm)};
	CK_RV rv = p->f->C_EncryptInit(p->session, &mech, key);
	if (rv != CKR_OK)
		return errmsg(err, errlen, -EKEYREJECTED, "C_EncryptInit(CKM_AES_GCM): %s (0x%lx)",
			      rv_name(rv), rv);
	CK_ULONG n = cap - 1 - IV_LEN;
	rv = p->f->C_Encrypt(p->session, (CK_BYTE_PTR)in, in_len, out + 1 + IV_LEN, &n);
	if (rv != CKR_OK)
		return errmsg(err, errlen, -EKEYREJECTED, "C_Encrypt: %s (0x%lx)", rv_name(rv), rv);
	if (n != in_len + TAG_LEN)
		return errmsg(err, errlen, -EIO, "C_Encrypt returned %lu bytes, expected %zu", n,
			      in_len + TAG_LEN);
	*out_len = 1 + IV_LEN + n;
	return 0;
}

static int do_unwrap(struct p11 *p, CK_OBJECT_HANDLE key, const uint8_t *in, size_t in_len,
		     uint8_t *out, size_t cap, size_t *out_len, char *err, size_t errlen)
{
	if (in_len <= WRAP_OVERHEAD || in[0] != WRAP_VERSION)
		return errmsg(err, errlen, -EINVAL,
			      "pkcs11: wrapped key is not a version %d AES-GCM blob", WRAP_VERSION);
	uint8_t iv[IV_LEN];
	memcpy(iv, in + 1, IV_LEN);
	CK_GCM_PARAMS gcm = gcm_params(iv);
	CK_MECHANISM mech = {CKM_AES_GCM, &gcm, sizeof(gcm)};
	CK_RV rv = p->f->C_DecryptInit(p->session, &mech, key);
	if (rv != CKR_OK)
		return errmsg(err, errlen, -EKEYREJECTED, "C_DecryptInit(CKM_AES_GCM): %s (0x%lx)",
			      rv_name(rv), rv);
	/* SoftHSM wants room for ciphertext+tag even though only the plaintext comes back. */
	uint8_t tmp[KEYPROV_WRAPPED_MAX];
	CK_ULONG n = sizeof(tmp);
	rv =
	    p->f->C_Decrypt(p->session, (CK_BYTE_PTR)in + 1 + IV_LEN, in_len - 1 - IV_LEN, tmp, &n);
	if (rv != CKR_OK) {
		crypto_cleanse(tmp, sizeof(tmp));
		return errmsg(err, errlen, -EKEYREJECTED,
			      "C_Decrypt: %s (0x%lx): wrong KEK or damaged wrapped key",
			      rv_name(rv), rv);
	}
	int r = 0;
	if (n > cap)
		r = errmsg(err, errlen, -EMSGSIZE, "pkcs11: unwrapped key too large");
	else {
		memcpy(out, tmp, n);
		*out_len = n;
	}
	crypto_cleanse(tmp, sizeof(tmp));
	return r;
}

int pkcs11_token_run(const char *config, int wrap, const uint8_t *in, size_t in_len, uint8_t *out,
		     size_t cap, size_t *out_len, char *err, size_t errlen)
{
	struct p11_conf c;
	struct p11 p;
	CK_OBJECT_HANDLE key = CK_INVALID_HANDLE;
	int r = keyprov_pkcs11_parse(config, &c, err, errlen);
	if (r)
		return r;
	r = p11_open(&c, &p, err, errlen);
	if (r)
		return r;
	r = find_key(&p, &c, &key, err, errlen);
	if (!r && wrap)
		r = do_wrap(&p, key, in, in_len, out, cap, out_len, err, errlen);
	else if (!r)
		r = do_unwrap(&p, key, in, in_len, out, cap, out_len, err, errlen);
	p11_close(&p);
	return r;
}
