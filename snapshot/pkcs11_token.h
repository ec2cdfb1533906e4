/* PKCS#11 provider config ("pkcs11:token=..;object=..") and the token operation cove-pkcs11 runs.
 */
#ifndef COVE_PKCS11_TOKEN_H
#define COVE_PKCS11_TOKEN_H

#include <stddef.h>
#include <stdint.h>

#define PKCS11_FIELD_MAX 1024

struct p11_conf {
	char module[PKCS11_FIELD_MAX];
	char token[PKCS11_FIELD_MAX];
	char object[PKCS11_FIELD_MAX];
	char pin_file[PKCS11_FIELD_MAX];
};

/* Parses a config (see keyprov.h); 0 or -EINVAL with one line in err. */
int keyprov_pkcs11_parse(const char *config, struct p11_conf *c, char *err, size_t errlen);

/*
 * In this process: load the module, log in, wrap (or unwrap) in with the token's KEK into out.
 * 0, -EKEYREJECTED (refused: the KEK may be revoked), -errno; one line in err. Only cove-pkcs11
 * calls it.
 */
int pkcs11_token_run(const char *config, int wrap, const uint8_t *in, size_t in_len, uint8_t *out,
		     size_t cap, size_t *out_len, char *err, size_t errlen);

#endif
