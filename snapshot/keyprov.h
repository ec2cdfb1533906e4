/* Key-encryption-key providers: wrap and unwrap a chain's data key; the KEK never leaves them. */
#ifndef COVE_KEYPROV_H
#define COVE_KEYPROV_H

#include <stddef.h>
#include <stdint.h>

#include "snapshot/crypto.h"

/*
 * Two providers:
 *
 * KEYPROV_CMD, config = a shell command line (run as /bin/sh -c 'CONFIG "$@"' with one more
 *   argument, "wrap" or "unwrap"). stdin: the input as one base64 line. stdout: the output as
 *   base64 (whitespace ignored, at most KEYPROV_WRAPPED_MAX bytes once decoded). Exit status 0
 *   = success; anything else = failure, reported with the first line of its stderr. A command
 *   running longer than KEYPROV_CMD_TIMEOUT_S is killed. The command line is stored in clear
 *   in the chain's "keys" file: put no secret in it. tools/key-cmd-openssl is a sample.
 *
 * KEYPROV_PKCS11, config = "pkcs11:token=LABEL;object=LABEL[;module=PATH][;pin-file=PATH]"
 *   module defaults to KEYPROV_PKCS11_DEFAULT_MODULE. The PIN is read from $COVE_PKCS11_PIN,
 *   else from pin-file (first line); it is never stored. The KEK is the AES key object with
 *   that label (CKO_SECRET_KEY, CKK_AES) on the token with that label; wrap = C_Encrypt with
 *   CKM_AES_GCM (random 96-bit IV, 128-bit tag, AAD "cove-dk-v1"), unwrap = C_Decrypt.
 *
 * Each PKCS#11 operation loads, initializes and finalizes the module: do not run two PKCS#11
 * operations on one module from two threads at once. key-cmd operations may run concurrently.
 *
 * Revocation: when the provider cannot or will not unwrap (key object destroyed, command exits
 * non-zero, tag mismatch in the token), keyprov_unwrap returns -EKEYREJECTED and err reads
 * "key provider refused to unwrap the data key: <reason>; the KEK may be revoked".
 */

enum keyprov_type {
	KEYPROV_CMD = 1,
	KEYPROV_PKCS11 = 2,
};

#define KEYPROV_WRAPPED_MAX	      4096u /* a wrapped data key, at most */
#define KEYPROV_CONFIG_MAX	      4096u /* a provider config string, at most */
#define KEYPROV_CMD_TIMEOUT_S	      120
#define KEYPROV_PKCS11_DEFAULT_MODULE "/usr/lib/softhsm/libsofthsm2.so"

struct keyprov;

/*
 * A provider of type with its config string. Nothing runs and no module is loaded until the
 * first wrap/unwrap. 0, -EINVAL (bad config, with a message in err), -ENOMEM.
 */
int keyprov_new(enum keyprov_type type, const char *config, struct keyprov **out, char *err,
		size_t errlen);
/* "key-cmd:CMDLINE" -> KEYPROV_CMD with CMDLINE; "pkcs11:..." -> KEYPROV_PKCS11 (whole spec). */
int keyprov_new_spec(const char *spec, struct keyprov **out, char *err, size_t errlen);
void keyprov_free(struct keyprov *kp);

enum keyprov_type keyprov_get_type(const struct keyprov *kp);
/* The non-secret config string as given to keyprov_new (what a keys file stores). */
const char *keyprov_config(const struct keyprov *kp);
/* "key-cmd" or "pkcs11". */
const char *keyprov_type_name(enum keyprov_type type);

/*
 * Wrap key: out gets at most cap bytes, *out_len the length. 0, -EKEYREJECTED (provider
 * refused, err says why), -EMSGSIZE (output too large), -errno otherwise; err gets one line.
 */
int keyprov_wrap(struct keyprov *kp, const struct snap_key *key, uint8_t *out, size_t cap,
		 size_t *out_len, char *err, size_t errlen);
/* Unwrap into a new locked key. 0, -EKEYREJECTED (see above), -errno otherwise; err: one line. */
int keyprov_unwrap(struct keyprov *kp, const uint8_t *wrapped, size_t len, struct snap_key **out,
		   char *err, size_t errlen);

/*
 * From now on run this provider through the key relay on `sock` (snapshot/keyprov_relay.h):
 * a jailed VMM, which can run no provider itself. The socket stays the caller's.
 */
void keyprov_set_relay(struct keyprov *kp, int sock);
/* One wrap (1) or unwrap (0) of raw bytes, through the relay if set: as keyprov_cmd_run. */
int keyprov_run(struct keyprov *kp, int wrap, const uint8_t *in, size_t in_len, uint8_t *out,
		size_t cap, size_t *out_len, char *err, size_t errlen);

/* Backends (keyprov_cmd.c, keyprov_pkcs11.c); called by keyprov.c only. -EKEYREJECTED = refused. */
/*
 * A provider process: path run with argv, the input as one base64 line on stdin, the output as
 * base64 on stdout, killed after KEYPROV_CMD_TIMEOUT_S. label and name only word messages;
 * exit_is_errno: a non-zero exit status is the errno of the failure and stderr's first line the
 * whole message (cove-pkcs11), else any failure is -EKEYREJECTED (a user's key-cmd).
 */
struct keyprov_exec {
	const char *label, *name, *op, *path;
	char *const *argv;
	int exit_is_errno;
};
int keyprov_exec_run(const struct keyprov_exec *x, const uint8_t *in, size_t in_len, uint8_t *out,
		     size_t cap, size_t *out_len, char *err, size_t errlen);
int keyprov_cmd_run(const char *cmdline, const char *op, const uint8_t *in, size_t in_len,
		    uint8_t *out, size_t cap, size_t *out_len, char *err, size_t errlen);
int keyprov_pkcs11_check(const char *config, char *err, size_t errlen);
int keyprov_pkcs11_run(const char *config, int wrap, const uint8_t *in, size_t in_len, uint8_t *out,
		       size_t cap, size_t *out_len, char *err, size_t errlen);

#endif
