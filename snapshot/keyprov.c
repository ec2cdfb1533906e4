/* Key providers: config parsing and the wrap/unwrap front end over the two backends. */
#include "snapshot/keyprov.h"
#include "snapshot/keyprov_relay.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/errmsg.h"

struct keyprov {
	enum keyprov_type type;
	char *config;
	int relay; /* a key relay's socket (a jailed VMM), or -1: run the provider here */
};

const char *keyprov_type_name(enum keyprov_type type)
{
	switch (type) {
	case KEYPROV_CMD:
		return "key-cmd";
	case KEYPROV_PKCS11:
		return "pkcs11";
	}
	return "unknown";
}

int keyprov_new(enum keyprov_type type, const char *config, struct keyprov **out, char *err,
		size_t errlen)
{
	if (!config || !*config)
		return errmsg(err, errlen, -EINVAL, "%s: empty provider config",
			      keyprov_type_name(type));
	size_t len = strlen(config);
	if (len > KEYPROV_CONFIG_MAX)
		return errmsg(err, errlen, -EINVAL, "%s: provider config longer than %u bytes",
			      keyprov_type_name(type), KEYPROV_CONFIG_MAX);
	if (strchr(config, '\n'))
		return errmsg(err, errlen, -EINVAL, "%s: provider config holds a newline",
			      keyprov_type_name(type));
	if (type == KEYPROV_PKCS11) {
		int r = keyprov_pkcs11_check(config, err, errlen);
		if (r)
			return r;
	} else if (type != KEYPROV_CMD) {
		return errmsg(err, errlen, -EINVAL, "unknown key provider type %d", (int)type);
	}
	struct keyprov *kp = calloc(1, sizeof(*kp));
	if (!kp)
		return -ENOMEM;
	kp->type = type;
	kp->relay = -1;
	kp->config = strdup(config);
	if (!kp->config) {
		free(kp);
		return -ENOMEM;
	}
	*out = kp;
	return 0;
}

int keyprov_new_spec(const char *spec, struct keyprov **out, char *err, size_t errlen)
{
	if (strncmp(spec, "key-cmd:", 8) == 0)
		return keyprov_new(KEYPROV_CMD, spec + 8, out, err, errlen);
	if (strncmp(spec, "pkcs11:", 7) == 0)
		return keyprov_new(KEYPROV_PKCS11, spec, out, err, errlen);
	return errmsg(err, errlen, -EINVAL,
		      "key provider '%.40s' is neither 'key-cmd:CMD' nor 'pkcs11:...'", spec);
}

void keyprov_free(struct keyprov *kp)
{
	if (!kp)
		return;
	free(kp->config);
	free(kp);
}

enum keyprov_type keyprov_get_type(const struct keyprov *kp)
{
	return kp->type;
}

const char *keyprov_config(const struct keyprov *kp)
{
	return kp->config;
}

void keyprov_set_relay(struct keyprov *kp, int sock)
{
	kp->relay = sock;
}

int keyprov_run(struct keyprov *kp, int wrap, const uint8_t *in, size_t in_len, uint8_t *out,
		size_t cap, size_t *out_len, char *err, size_t errlen)
{
	if (kp->relay >= 0)
		return keyrelay_call(kp->relay, kp->type, kp->config, wrap, in, in_len, out, cap,
				     out_len, err, errlen);
	if (kp->type == KEYPROV_CMD)
		return keyprov_cmd_run(kp->config, wrap ? "wrap" : "unwrap", in, in_len, out, cap,
				       out_len, err, errlen);
	return keyprov_pkcs11_run(kp->config, wrap, in, in_len, out, cap, out_len, err, errlen);
}

int keyprov_wrap(struct keyprov *kp, const struct snap_key *key, uint8_t *out, size_t cap,
		 size_t *out_len, char *err, size_t errlen)
{
	char why[256] = "";
	int r = keyprov_run(kp, 1, crypto_key_bytes(key), CRYPTO_KEY_LEN, out, cap, out_len, why,
			    sizeof(why));
	if (r == -EKEYREJECTED)
		return errmsg(err, errlen, r, "key provider refused to wrap the data key: %s", why);
	if (r)
		return errmsg(err, errlen, r, "%s", why);
	if (*out_len == 0)
		return errmsg(err, errlen, -EINVAL, "key provider returned an empty wrapped key");
	return 0;
}

int keyprov_unwrap(struct keyprov *kp, const uint8_t *wrapped, size_t len, struct snap_key **out,
		   char *err, size_t errlen)
{
	char why[256] = "";
	uint8_t raw[KEYPROV_WRAPPED_MAX];
	size_t n = 0;
	if (len == 0 || len > KEYPROV_WRAPPED_MAX)
		return errmsg(err, errlen, -EINVAL, "wrapped data key of %zu bytes (1..%u)", len,
			      KEYPROV_WRAPPED_MAX);
	int r = keyprov_run(kp, 0, wrapped, len, raw, sizeof(raw), &n, why, sizeof(why));
	if (r == -EKEYREJECTED) {
		r = errmsg(
		    err, errlen, r,
		    "key provider refused to unwrap the data key: %s; the KEK may be revoked", why);
		goto out;
	}
	if (r) {
		r = errmsg(err, errlen, r, "%s", why);
		goto out;
	}
	if (n != CRYPTO_KEY_LEN) {
		r = errmsg(err, errlen, -EBADMSG,
			   "key provider unwrapped %zu bytes, not a %d-byte data key", n,
			   CRYPTO_KEY_LEN);
		goto out;
	}
	r = crypto_key_import(raw, out);
	if (r)
		r = errmsg(err, errlen, r, "cannot allocate the data key: %s", strerror(-r));
out:
	crypto_cleanse(raw, sizeof(raw));
	return r;
}
