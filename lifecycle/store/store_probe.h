/* The store's start-up probe: it must honour create-only writes (If-None-Match: *). */
#ifndef COVE_STORE_PROBE_H
#define COVE_STORE_PROBE_H

#include <stddef.h>

struct s3_client;

/*
 * PUTs one fresh probe key twice with If-None-Match: *; the first must be stored and the
 * second answered 412. Anything else (Swift's s3api answers 501; some stores overwrite) is
 * refused with one line: the fencing of later generations depends on that answer. The key is
 * deleted afterwards. 0 or -errno (-EOPNOTSUPP for a store without conditional create).
 */
int store_probe(struct s3_client *c, char *err, size_t errlen);

/* The probe's verdict from the two PUTs' results (0 or -errno each); first_err/second_err are
 * their messages. Pure: unit-tested without a server. */
int store_probe_decide(int first, const char *first_err, int second, const char *second_err,
		       char *err, size_t errlen);

#endif
