/* The per-sandbox CA that cove-broker's egress proxy signs its TLS leaf certificates with. */
#ifndef COVE_BROKER_MITM_CA_H
#define COVE_BROKER_MITM_CA_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <openssl/evp.h>
#include <openssl/x509.h>

#define MITM_CA_KEY_FILE  "mitm-ca.key" /* PEM private key, mode 0600: never leaves the host */
#define MITM_CA_CERT_FILE "mitm-ca.crt" /* PEM certificate: goes into the sandbox's trust store */
#define MITM_CA_FILE_MAX  (16 * 1024)
#define MITM_CA_DAYS	  3650
#define MITM_LEAF_CACHE	  64
#define MITM_LEAF_SECS	  (24 * 3600) /* leaf validity */
#define MITM_LEAF_RENEW	  (3600)      /* re-mint when less than this is left */
#define MITM_HOST_MAX	  253

struct mitm_leaf {
	char host[MITM_HOST_MAX + 1]; /* "" = free slot */
	X509 *cert;
	int64_t not_after; /* unix seconds */
	uint64_t used;	   /* LRU tick */
};

struct mitm_ca {
	EVP_PKEY *key; /* the CA key */
	X509 *cert;
	EVP_PKEY *leaf_key; /* one P-256 key for every leaf, in memory only */
	struct mitm_leaf cache[MITM_LEAF_CACHE];
	uint64_t tick;
	pthread_mutex_t lock; /* the cache, for proxies with a thread per connection */
	int lock_ready;
};

/*
 * Loads the CA from MITM_CA_KEY_FILE and MITM_CA_CERT_FILE beneath dirfd, or creates both when
 * the key is absent: an EC P-256 key (written O_EXCL, mode 0600, through a temp file renamed
 * into place after the certificate) and a self-signed certificate "cove sandbox NAME CA"
 * (basicConstraints CA:TRUE critical, keyUsage keyCertSign+cRLSign critical, MITM_CA_DAYS).
 * Files are opened without following links; a key file that is not a regular file of ours with
 * no group/other access, or that does not match the certificate, is refused. sandbox is
 * 1..64 printable ASCII characters (it only names a new CA). Returns 0 or -errno with a one-line
 * message in err.
 */
int mitm_ca_open(struct mitm_ca *ca, int dirfd, const char *sandbox, char *err, size_t errlen);

/* Frees everything (the keys are freed by OpenSSL, which clears EC private keys). Safe to call
 * twice. */
void mitm_ca_free(struct mitm_ca *ca);

/* The CA certificate as PEM in a malloc'd NUL-terminated buffer (*len without the NUL), for the
 * sandbox's disk. Returns 0 or -ENOMEM. */
int mitm_ca_cert_pem(const struct mitm_ca *ca, char **pem, size_t *len);

/* True when host is a name a leaf can be minted for: a DNS name (letters, digits, '-', '.',
 * labels 1..63, at most 253) or an IPv4/IPv6 literal. */
int mitm_host_valid(const char *host);

/*
 * The leaf certificate for host (a DNS name or an IP literal; case-insensitive), minted on
 * first use and cached (at most MITM_LEAF_CACHE hosts, least recently used evicted; re-minted
 * when close to expiry): SAN dNSName or iPAddress, EKU serverAuth, keyUsage digitalSignature,
 * a random 128-bit serial, valid from 5 minutes ago for MITM_LEAF_SECS, signed by the CA with
 * SHA-256. *cert is a new reference the caller X509_free()s; its key is ca->leaf_key. Safe to
 * call from several threads (the cache has a lock). Returns 0 or -errno (-EINVAL: bad host).
 */
int mitm_ca_leaf(struct mitm_ca *ca, const char *host, X509 **cert, char *err, size_t errlen);

#endif
