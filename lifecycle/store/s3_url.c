/* Keys and URLs: the configured prefix, percent-encoding, path-style or virtual-hosted. */
#include "lifecycle/store/s3_internal.h"

#include "common/errmsg.h"
#include "common/hex.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>

int s3_full_key(const struct s3_client *c, const char *key, char *out, size_t outlen, char *err,
		size_t errlen)
{
	size_t pl = strlen(c->cfg.prefix), kl = strlen(key);
	if (!kl)
		return errmsg(err, errlen, -EINVAL, "s3: empty key");
	if (pl + kl > S3_KEY_MAX || pl + kl + 1 > outlen)
		return errmsg(err, errlen, -ENAMETOOLONG, "s3: key %.64s... is over %d bytes", key,
			      S3_KEY_MAX);
	for (const char *p = key; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			return errmsg(err, errlen, -EINVAL, "s3: key holds a control byte");
	memcpy(out, c->cfg.prefix, pl);
	memcpy(out + pl, key, kl + 1);
	return 0;
}

int s3_uri_encode(const char *s, bool keep_slash, char *out, size_t outlen)
{
	static const char hexd[] = "0123456789ABCDEF";
	size_t o = 0;
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		bool keep = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
			    (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.' ||
			    ch == '~' || (keep_slash && ch == '/');
		if (o + (keep ? 1 : 3) >= outlen)
			return -ENAMETOOLONG;
		if (keep) {
			out[o++] = (char)ch;
		} else {
			out[o++] = '%';
			out[o++] = hexd[ch >> 4];
			out[o++] = hexd[ch & 15];
		}
	}
	out[o] = '\0';
	return 0;
}

int s3_url(const struct s3_client *c, const char *key, const char *query, char *out, size_t outlen)
{
	char enc[3 * S3_KEY_MAX + 1] = "";
	if (key && s3_uri_encode(key, true, enc, sizeof(enc)))
		return -ENAMETOOLONG;
	const char *ep = c->cfg.endpoint;
	const char *host = strstr(ep, "://") + 3; /* checked by store_config_parse */
	int n;
	if (c->cfg.addressing == STORE_ADDR_VIRTUAL)
		n = snprintf(out, outlen, "%.*s%s.%s/%s%s%s", (int)(host - ep), ep, c->cfg.bucket,
			     host, enc, query ? "?" : "", query ? query : "");
	else
		n = snprintf(out, outlen, "%s/%s/%s%s%s", ep, c->cfg.bucket, enc, query ? "?" : "",
			     query ? query : "");
	return n < 0 || (size_t)n >= outlen ? -ENAMETOOLONG : 0;
}

void s3_sha256_hex(const void *buf, size_t len, char out[65])
{
	unsigned char md[32];
	unsigned int mdlen = 0;
	EVP_Digest(buf, len, md, &mdlen, EVP_sha256(), NULL);
	hex_encode(md, sizeof(md), out);
}
