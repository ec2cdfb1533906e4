/* MAC'ed JSON objects of the store (json_mac.h). */
#include "lifecycle/store/json_mac.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "common/errmsg.h"
#include "snapshot/digest.h"

int store_json_mac(json_t *o, const char *label, const uint8_t *key, size_t keylen, uint8_t mac[32])
{
	char *text = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENSURE_ASCII);
	if (!text)
		return -ENOMEM;
	size_t tl = strlen(text), ll = strlen(label);
	unsigned char *msg = malloc(ll + tl);
	int r = -ENOMEM;
	if (msg) {
		memcpy(msg, label, ll);
		memcpy(msg + ll, text, tl);
		unsigned ml = 0;
		r = HMAC(EVP_sha256(), key, (int)keylen, msg, ll + tl, mac, &ml) && ml == 32 ? 0
											     : -EIO;
	}
	free(msg);
	free(text);
	return r;
}

char *store_json_seal(json_t *o, const char *label, const uint8_t *key, size_t keylen)
{
	uint8_t mac[32];
	char hex[DIGEST_HEX_LEN];
	if (!o || store_json_mac(o, label, key, keylen, mac))
		return NULL;
	digest_hex(mac, hex);
	if (json_object_set_new(o, "mac", json_string(hex)))
		return NULL;
	return json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENSURE_ASCII);
}

json_t *store_json_open(const char *buf, size_t len, const char *label, const uint8_t *key,
			size_t keylen, const char *what, int *ret, char *err, size_t errlen)
{
	json_error_t je;
	json_t *o = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
	if (!json_is_object(o)) {
		json_decref(o);
		*ret =
		    errmsg(err, errlen, -EBADMSG, "%s: not a JSON object (%.80s)", what, je.text);
		return NULL;
	}
	uint8_t want[32], got[32];
	const char *hex = json_string_value(json_object_get(o, "mac"));
	int r = 0;
	if (!hex || digest_unhex(hex, want)) {
		r = errmsg(err, errlen, -EBADMSG, "%s: no MAC (64 lower-case hex digits)", what);
	} else {
		json_object_del(o, "mac");
		r = store_json_mac(o, label, key, keylen, got);
		if (r)
			r = errmsg(err, errlen, r, "%s: cannot compute its MAC", what);
		else if (CRYPTO_memcmp(want, got, 32))
			r = errmsg(err, errlen, -EBADMSG,
				   "%s: bad MAC (not written by a host of this fleet, or changed "
				   "since)",
				   what);
	}
	*ret = r;
	if (r) {
		json_decref(o);
		return NULL;
	}
	return o;
}
