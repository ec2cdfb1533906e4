/*
 * One owner at a time: a sandbox's lease in the store, sandboxes/NAME/lease (issue 30).
 *
 * The lease object names its owner's host id, an epoch (raised at every change of owner), the
 * generation the owner started from and an expiry (wall-clock ms), MAC'ed under the fleet key.
 * It is created with a create-only PUT (If-None-Match: *) and replaced only with If-Match on
 * the ETag read, so of two hosts racing for it exactly one write lands. Guarantee and clock
 * assumptions: lifecycle/store/LEASE.md.
 */
#ifndef COVE_STORE_LEASE_H
#define COVE_STORE_LEASE_H

#include <stddef.h>
#include <stdint.h>

#include "lifecycle/name.h"
#include "lifecycle/store/s3.h"
#include "lifecycle/store/store_config.h"

#define STORE_LEASE_MAX 4096 /* bytes of a lease object read back */

struct store_lease {
	char sandbox[SBX_NAME_MAX + 1];
	char host[STORE_HOST_ID_MAX + 1]; /* "" once released */
	uint64_t epoch;			  /* >= 1 */
	uint64_t generation;		  /* the generation its owner started from */
	int64_t expires_ms;		  /* wall clock; 0 once released */
	char etag[S3_ETAG_MAX + 1];	  /* the version this was read or written as */
};

/* The lease's MAC'ed JSON (malloc'ed) or NULL. */
char *store_lease_encode(const struct store_lease *l, const uint8_t *key, size_t keylen);
/* Parses and authenticates a lease read from the store (MAC first, then every field). */
int store_lease_decode(const char *buf, size_t len, const uint8_t *key, size_t keylen,
		       struct store_lease *l, char *err, size_t errlen);

/*
 * Takes NAME's lease for cfg->host_id, starting from generation `gen`: free (absent or
 * released), expired for longer than the clock skew, or already this host's. 0 with *held;
 * -EBUSY with *other (owner and expiry) when another host holds it; other -errno with err.
 * `now_ms` is the wall clock (a parameter, for tests).
 */
int store_lease_take(struct s3_client *c, const struct store_config *cfg, const char *name,
		     uint64_t gen, int64_t now_ms, struct store_lease *held,
		     struct store_lease *other, char *err, size_t errlen);
/* Extends a held lease to now + ttl. -ESTALE when it has moved on (err names the owner). */
int store_lease_renew(struct s3_client *c, const struct store_config *cfg, struct store_lease *held,
		      int64_t now_ms, char *err, size_t errlen);
/* Releases a held lease (owner "" and expiry 0); -ESTALE when it had moved on already. */
int store_lease_release(struct s3_client *c, const struct store_config *cfg,
			struct store_lease *held, char *err, size_t errlen);
/* Reads NAME's lease: 0, -ENOENT (none), or -errno. */
int store_lease_read(struct s3_client *c, const struct store_config *cfg, const char *name,
		     struct store_lease *l, char *err, size_t errlen);

/*
 * This host's own records, in the sandbox's directory (host files: the jailed VMM sees only
 * the chain directory): the lease it holds (STORE_LEASE_FILE) and the generation its chain
 * is (STORE_BASE_FILE: pulled, or last committed from here). Written to a temporary file and
 * renamed; read with a size cap. 0, -ENOENT (none) or -errno.
 */
#define STORE_LEASE_FILE "store-lease.json"
#define STORE_BASE_FILE	 "store-base"
int store_lease_save(int dfd, const struct store_lease *l);
int store_lease_load(int dfd, struct store_lease *l);
int store_base_save(int dfd, uint64_t gen);
int store_base_load(int dfd, uint64_t *gen);

#endif
