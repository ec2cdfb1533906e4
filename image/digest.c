/* SHA-256 through OpenSSL's EVP, and the OCI digest text form. */
#include "image/digest.h"

#include "common/hex.h"

#include <errno.h>
#include <openssl/evp.h>
#include <string.h>

int digest_parse(const char *s, char hex[DIGEST_HEX + 1])
{
	if (!s || strncmp(s, "sha256:", 7) != 0 || strlen(s) != 7 + DIGEST_HEX)
		return -EINVAL;
	for (int i = 0; i < DIGEST_HEX; i++) {
		char c = s[7 + i];
		if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
			return -EINVAL;
	}
	memcpy(hex, s + 7, DIGEST_HEX);
	hex[DIGEST_HEX] = '\0';
	return 0;
}

int sha256_begin(struct sha256_stream *s)
{
	s->bytes = 0;
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	if (!c)
		return -ENOMEM;
	if (EVP_DigestInit_ex(c, EVP_sha256(), NULL) != 1) {
		EVP_MD_CTX_free(c);
		return -EIO;
	}
	s->ctx = c;
	return 0;
}

void sha256_add(struct sha256_stream *s, const void *p, size_t n)
{
	if (s->ctx && n)
		EVP_DigestUpdate(s->ctx, p, n);
	s->bytes += n;
}

int sha256_end(struct sha256_stream *s, char hex[DIGEST_HEX + 1])
{
	unsigned char md[32];
	unsigned int len = 0;
	int ok = s->ctx && EVP_DigestFinal_ex(s->ctx, md, &len) == 1 && len == sizeof(md);
	sha256_abort(s);
	if (!ok)
		return -EIO;
	hex_encode(md, sizeof(md), hex);
	return 0;
}

void sha256_abort(struct sha256_stream *s)
{
	if (s->ctx)
		EVP_MD_CTX_free(s->ctx);
	s->ctx = NULL;
}

int sha256_hex(const void *p, size_t n, char hex[DIGEST_HEX + 1])
{
	struct sha256_stream s;
	int r = sha256_begin(&s);
	if (r)
		return r;
	sha256_add(&s, p, n);
	return sha256_end(&s, hex);
}
