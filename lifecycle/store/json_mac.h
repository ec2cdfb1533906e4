/* MAC'ed JSON objects of the store (manifests, leases): HMAC-SHA256 under the fleet key. */
#ifndef COVE_STORE_JSON_MAC_H
#define COVE_STORE_JSON_MAC_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/* HMAC-SHA256(key, label + the compact, key-sorted, ASCII JSON of o). 0, -ENOMEM or -EIO. */
int store_json_mac(json_t *o, const char *label, const uint8_t *key, size_t keylen,
		   uint8_t mac[32]);
/* o with "mac" set, as compact sorted JSON text (malloc'ed), or NULL. */
char *store_json_seal(json_t *o, const char *label, const uint8_t *key, size_t keylen);
/*
 * Parses buf as a JSON object and checks its "mac" (then removed) before anything else is
 * read: the object (json_decref it), or NULL with one line in err, -EBADMSG in *ret.
 * `what` names the object in errors ("lease").
 */
json_t *store_json_open(const char *buf, size_t len, const char *label, const uint8_t *key,
			size_t keylen, const char *what, int *ret, char *err, size_t errlen);

#endif
