/* The per-sandbox CA: created once beneath the sandbox's directory fd, loaded afterwards; mints
 * short-lived leaf certificates per host, cached in memory. */
#include "mitm_ca.h"
#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "common/fd_io.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define KEY_TMP	 ".mitm-ca.key.tmp"
#define CERT_TMP ".mitm-ca.crt.tmp"

/* The first queued OpenSSL error as text (the queue is cleared). */
static const char *ossl_why(char *buf, size_t cap)
{
	unsigned long e = ERR_get_error();

	if (!e)
		snprintf(buf, cap, "unknown OpenSSL error");
	else
		ERR_error_string_n(e, buf, cap);
	ERR_clear_error();
	return buf;
}

static int sandbox_name_ok(const char *s)
{
	size_t i, n = strlen(s);

	if (n == 0 || n > 64)
		return 0;
	for (i = 0; i < n; i++)
		if (s[i] < 0x20 || s[i] > 0x7e)
			return 0;
	return 1;
}

int mitm_host_valid(const char *host)
{
	unsigned char ip[16];
	size_t n = strlen(host), label = 0, i;

	if (inet_pton(AF_INET, host, ip) == 1 || inet_pton(AF_INET6, host, ip) == 1)
		return 1;
	if (n == 0 || n > MITM_HOST_MAX)
		return 0;
	for (i = 0; i < n; i++) {
		char c = host[i];

		if (c == '.') {
			if (label == 0 || host[i - 1] == '-')
				return 0;
			label = 0;
		} else if (isalnum((unsigned char)c) || c == '-') {
			if (c == '-' && label == 0)
				return 0;
			if (++label > 63)
				return 0;
		} else {
			return 0;
		}
	}
	return label > 0 && host[n - 1] != '-';
}

static int add_ext(X509 *cert, X509 *issuer, int nid, const char *value)
{
	X509V3_CTX ctx;
	X509_EXTENSION *ext;
	int ok;

	X509V3_set_ctx_nodb(&ctx);
	X509V3_set_ctx(&ctx, issuer, cert, NULL, NULL, 0);
	ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
	if (!ext)
		return -EINVAL;
	ok = X509_add_ext(cert, ext, -1);
	X509_EXTENSION_free(ext);
	return ok ? 0 : -ENOMEM;
}

/* A random positive 128-bit serial. */
static int set_serial(X509 *cert)
{
	unsigned char b[16];
	BIGNUM *bn;
	int ok;

	if (RAND_bytes(b, sizeof(b)) != 1)
		return -EIO;
	b[0] = (b[0] & 0x7f) | 0x40; /* positive, never zero, always 16 bytes */
	bn = BN_bin2bn(b, sizeof(b), NULL);
	if (!bn)
		return -ENOMEM;
	ok = BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert)) != NULL;
	BN_free(bn);
	return ok ? 0 : -ENOMEM;
}

/* A new certificate for key, valid [now + from_s, now + to_s], issued by issuer (NULL: self). */
static X509 *cert_new(EVP_PKEY *pub, const char *cn, long from_s, long to_s)
{
	X509 *c = X509_new();
	X509_NAME *name;

	if (!c)
		return NULL;
	if (!X509_set_version(c, 2) || set_serial(c) ||
	    !X509_gmtime_adj(X509_getm_notBefore(c), from_s) ||
	    !X509_gmtime_adj(X509_getm_notAfter(c), to_s) || !X509_set_pubkey(c, pub))
		goto fail;
	name = X509_get_subject_name(c);
	if (!X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, (const unsigned char *)"cove", -1,
					-1, 0))
		goto fail;
	if (cn && !X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn,
					      -1, -1, 0))
		goto fail;
	return c;
fail:
	X509_free(c);
	return NULL;
}

/* The PEM text of a key or certificate, in a malloc'd buffer the caller wipes and frees. */
static char *pem_of(EVP_PKEY *key, X509 *cert, size_t *len)
{
	BIO *b = BIO_new(BIO_s_mem());
	char *data, *out = NULL;
	long n;
	int ok;

	if (!b)
		return NULL;
	ok = key ? PEM_write_bio_PrivateKey(b, key, NULL, NULL, 0, NULL, NULL)
		 : PEM_write_bio_X509(b, cert);
	n = BIO_get_mem_data(b, &data);
	if (ok && n > 0 && (out = malloc((size_t)n + 1))) {
		memcpy(out, data, (size_t)n);
		out[n] = '\0';
		*len = (size_t)n;
	}
	if (n > 0)
		OPENSSL_cleanse(data, (size_t)n);
	BIO_free(b);
	return out;
}

/* Writes text to a fresh temp file beneath dirfd (O_EXCL, mode) and fsyncs it. */
static int write_new(int dirfd, const char *name, const char *text, size_t len, mode_t mode)
{
	int fd = dirfd_create(dirfd, name, O_WRONLY, mode), r;

	if (fd < 0)
		return fd;
	r = write_full(fd, text, len);
	if (!r && fsync(fd) < 0)
		r = -errno;
	close(fd);
	if (r)
		dirfd_unlink(dirfd, name);
	return r;
}

static int ca_create(struct mitm_ca *ca, int dirfd, const char *sandbox, char *err, size_t errlen)
{
	char cn[96], why[160], *kpem = NULL, *cpem = NULL;
	size_t klen = 0, clen = 0;
	int r;

	snprintf(cn, sizeof(cn), "cove sandbox %s CA", sandbox);
	ca->key = EVP_EC_gen("P-256");
	if (!ca->key)
		return errmsg(err, errlen, -ENOMEM, "mitm CA: key generation: %s",
			      ossl_why(why, sizeof(why)));
	ca->cert = cert_new(ca->key, cn, -300, (long)MITM_CA_DAYS * 86400);
	if (!ca->cert || !X509_set_issuer_name(ca->cert, X509_get_subject_name(ca->cert)) ||
	    add_ext(ca->cert, ca->cert, NID_basic_constraints, "critical,CA:TRUE") ||
	    add_ext(ca->cert, ca->cert, NID_key_usage, "critical,keyCertSign,cRLSign") ||
	    add_ext(ca->cert, ca->cert, NID_subject_key_identifier, "hash") ||
	    !X509_sign(ca->cert, ca->key, EVP_sha256()))
		return errmsg(err, errlen, -ENOMEM, "mitm CA: certificate: %s",
			      ossl_why(why, sizeof(why)));
	kpem = pem_of(ca->key, NULL, &klen);
	cpem = pem_of(NULL, ca->cert, &clen);
	if (!kpem || !cpem) {
		r = errmsg(err, errlen, -ENOMEM, "mitm CA: out of memory");
		goto out;
	}
	/* The key goes in last: it is what marks the pair complete (a crash before leaves no key,
	 * so the next start creates both again). */
	r = write_new(dirfd, KEY_TMP, kpem, klen, 0600);
	if (!r)
		r = write_new(dirfd, CERT_TMP, cpem, clen, 0644);
	if (!r)
		r = dirfd_rename(dirfd, CERT_TMP, MITM_CA_CERT_FILE);
	if (!r) {
		/* Never replace a key another process created meanwhile. */
		if (renameat2(dirfd, KEY_TMP, dirfd, MITM_CA_KEY_FILE, RENAME_NOREPLACE) < 0)
			r = -errno;
	}
	if (!r)
		r = dirfd_sync(dirfd);
	if (r) {
		dirfd_unlink(dirfd, KEY_TMP);
		dirfd_unlink(dirfd, CERT_TMP);
		r = errmsg(err, errlen, r, "mitm CA: writing %s: %s", MITM_CA_KEY_FILE,
			   strerror(-r));
	}
out:
	if (kpem)
		OPENSSL_cleanse(kpem, klen);
	free(kpem);
	free(cpem);
	return r;
}

/* Reads a small file beneath dirfd (no links); a key file must be ours and private. */
static int read_small(int dirfd, const char *name, int secret, char *buf, size_t cap, size_t *len,
		      char *err, size_t errlen)
{
	struct stat st;
	ssize_t n;
	int fd = dirfd_open(dirfd, name, O_RDONLY);

	if (fd < 0)
		return errmsg(err, errlen, fd, "mitm CA: %s: %s", name, strerror(-fd));
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return errmsg(err, errlen, -EINVAL, "mitm CA: %s is not a regular file", name);
	}
	if (secret && (st.st_uid != geteuid() || (st.st_mode & 077))) {
		close(fd);
		return errmsg(err, errlen, -EPERM,
			      "mitm CA: %s must belong to us with no group/other access", name);
	}
	n = read_upto(fd, buf, cap);
	close(fd);
	if (n < 0)
		return errmsg(err, errlen, (int)n, "mitm CA: %s: %s", name, strerror((int)-n));
	if ((size_t)n == cap)
		return errmsg(err, errlen, -EFBIG, "mitm CA: %s over %zu bytes", name, cap - 1);
	buf[n] = '\0';
	*len = (size_t)n;
	return 0;
}

static int ca_load(struct mitm_ca *ca, int dirfd, char *err, size_t errlen)
{
	char *buf = malloc(MITM_CA_FILE_MAX), why[160];
	BASIC_CONSTRAINTS *bc;
	size_t len = 0;
	BIO *b;
	int r, is_ca;

	if (!buf)
		return errmsg(err, errlen, -ENOMEM, "mitm CA: out of memory");
	r = read_small(dirfd, MITM_CA_KEY_FILE, 1, buf, MITM_CA_FILE_MAX, &len, err, errlen);
	if (!r) {
		b = BIO_new_mem_buf(buf, (int)len);
		ca->key = b ? PEM_read_bio_PrivateKey(b, NULL, NULL, NULL) : NULL;
		BIO_free(b);
		if (!ca->key)
			r = errmsg(err, errlen, -EINVAL, "mitm CA: %s: %s", MITM_CA_KEY_FILE,
				   ossl_why(why, sizeof(why)));
	}
	OPENSSL_cleanse(buf, MITM_CA_FILE_MAX);
	if (!r)
		r = read_small(dirfd, MITM_CA_CERT_FILE, 0, buf, MITM_CA_FILE_MAX, &len, err,
			       errlen);
	if (!r) {
		b = BIO_new_mem_buf(buf, (int)len);
		ca->cert = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
		BIO_free(b);
		if (!ca->cert)
			r = errmsg(err, errlen, -EINVAL, "mitm CA: %s: %s", MITM_CA_CERT_FILE,
				   ossl_why(why, sizeof(why)));
	}
	free(buf);
	if (r)
		return r;
	if (X509_check_private_key(ca->cert, ca->key) != 1) {
		ERR_clear_error();
		return errmsg(err, errlen, -EINVAL, "mitm CA: %s does not match %s",
			      MITM_CA_CERT_FILE, MITM_CA_KEY_FILE);
	}
	bc = X509_get_ext_d2i(ca->cert, NID_basic_constraints, NULL, NULL);
	is_ca = bc && bc->ca;
	BASIC_CONSTRAINTS_free(bc);
	if (!is_ca)
		return errmsg(err, errlen, -EINVAL, "mitm CA: %s is not a CA certificate",
			      MITM_CA_CERT_FILE);
	return 0;
}

int mitm_ca_open(struct mitm_ca *ca, int dirfd, const char *sandbox, char *err, size_t errlen)
{
	char why[160];
	int r;

	memset(ca, 0, sizeof(*ca));
	if (!sandbox_name_ok(sandbox))
		return errmsg(err, errlen, -EINVAL,
			      "mitm CA: sandbox name must be 1..64 printable "
			      "ASCII characters");
	r = pthread_mutex_init(&ca->lock, NULL);
	if (r)
		return errmsg(err, errlen, -r, "mitm CA: mutex: %s", strerror(r));
	ca->lock_ready = 1;
	r = faccessat(dirfd, MITM_CA_KEY_FILE, F_OK, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
	if (r == -ENOENT)
		r = ca_create(ca, dirfd, sandbox, err, errlen);
	else if (!r)
		r = ca_load(ca, dirfd, err, errlen);
	else
		r = errmsg(err, errlen, r, "mitm CA: %s: %s", MITM_CA_KEY_FILE, strerror(-r));
	if (!r) {
		ca->leaf_key = EVP_EC_gen("P-256");
		if (!ca->leaf_key)
			r = errmsg(err, errlen, -ENOMEM, "mitm CA: leaf key: %s",
				   ossl_why(why, sizeof(why)));
	}
	if (r)
		mitm_ca_free(ca);
	return r;
}

void mitm_ca_free(struct mitm_ca *ca)
{
	size_t i;

	if (!ca->lock_ready)
		return;
	for (i = 0; i < MITM_LEAF_CACHE; i++)
		X509_free(ca->cache[i].cert);
	EVP_PKEY_free(ca->key);
	EVP_PKEY_free(ca->leaf_key);
	X509_free(ca->cert);
	pthread_mutex_destroy(&ca->lock);
	memset(ca, 0, sizeof(*ca));
}

int mitm_ca_cert_pem(const struct mitm_ca *ca, char **pem, size_t *len)
{
	*pem = pem_of(NULL, ca->cert, len);
	return *pem ? 0 : -ENOMEM;
}

static X509 *leaf_mint(struct mitm_ca *ca, const char *host)
{
	unsigned char ip[16];
	char san[MITM_HOST_MAX + 8];
	int is_ip = inet_pton(AF_INET, host, ip) == 1 || inet_pton(AF_INET6, host, ip) == 1;
	/* CN is at most 64 characters; the SAN is what clients check anyway. */
	X509 *c = cert_new(ca->leaf_key, strlen(host) <= 64 ? host : NULL, -300, MITM_LEAF_SECS);

	snprintf(san, sizeof(san), "%s:%s", is_ip ? "IP" : "DNS", host);
	if (!c || !X509_set_issuer_name(c, X509_get_subject_name(ca->cert)) ||
	    add_ext(c, ca->cert, NID_basic_constraints, "critical,CA:FALSE") ||
	    add_ext(c, ca->cert, NID_key_usage, "critical,digitalSignature") ||
	    add_ext(c, ca->cert, NID_ext_key_usage, "serverAuth") ||
	    add_ext(c, ca->cert, NID_subject_alt_name, san) ||
	    add_ext(c, ca->cert, NID_authority_key_identifier, "keyid:always") ||
	    !X509_sign(c, ca->key, EVP_sha256())) {
		X509_free(c);
		return NULL;
	}
	return c;
}

int mitm_ca_leaf(struct mitm_ca *ca, const char *host, X509 **cert, char *err, size_t errlen)
{
	char lower[MITM_HOST_MAX + 1], why[160];
	struct mitm_leaf *slot = NULL, *e;
	int64_t now = (int64_t)time(NULL);
	size_t i, n = strlen(host);
	X509 *c;

	*cert = NULL;
	if (!mitm_host_valid(host))
		return errmsg(err, errlen, -EINVAL, "mitm: not a host name or address");
	for (i = 0; i <= n; i++)
		lower[i] = (char)tolower((unsigned char)host[i]);
	pthread_mutex_lock(&ca->lock);
	ca->tick++;
	for (i = 0; i < MITM_LEAF_CACHE; i++) {
		e = &ca->cache[i];
		if (e->host[0] && !strcmp(e->host, lower)) {
			slot = e;
			if (e->not_after - now > MITM_LEAF_RENEW) {
				e->used = ca->tick;
				X509_up_ref(e->cert);
				*cert = e->cert;
				pthread_mutex_unlock(&ca->lock);
				return 0;
			}
			break;
		}
		if (!slot || !e->host[0] || (slot->host[0] && e->used < slot->used))
			slot = e;
	}
	c = leaf_mint(ca, lower);
	if (!c) {
		pthread_mutex_unlock(&ca->lock);
		return errmsg(err, errlen, -ENOMEM, "mitm: leaf for %s: %s", lower,
			      ossl_why(why, sizeof(why)));
	}
	X509_free(slot->cert);
	memcpy(slot->host, lower, n + 1);
	slot->cert = c;
	slot->not_after = now + MITM_LEAF_SECS;
	slot->used = ca->tick;
	X509_up_ref(c);
	*cert = c;
	pthread_mutex_unlock(&ca->lock);
	return 0;
}
