/* Credential injection into a request head the egress proxy forwards, and the matching scrubber
 * for what comes back. */
#ifndef COVE_BROKER_INJECT_H
#define COVE_BROKER_INJECT_H

#include <stddef.h>

#include "helper.h"
#include "policy.h"
#include "scrub.h"

#define INJECT_PLACEHOLDER "cove-credential:" /* followed by the credential's name */
#define INJECT_MAX_HEADERS 128
#define INJECT_VALUE_MAX   (8 * 1024) /* an injected header value, filled */
#define INJECT_HEAD_MAX	   (64 * 1024)

struct inject_hdr {
	const char *name; /* NUL-terminated, as the guest sent them */
	const char *value;
};

/* One HTTP/1.1 request head from the guest, already split by the HTTP parser. */
struct inject_req {
	const char *method; /* e.g. "GET" */
	const char *target; /* origin-form: starts with '/' */
	const char *host;   /* the host the proxy terminated TLS for (CONNECT host) */
	unsigned port;
	const struct inject_hdr *h;
	size_t nh;
	unsigned long long content_length; /* when has_length */
	int has_length, chunked;
};

/*
 * Builds the head to send upstream ("METHOD target HTTP/1.1\r\n" ... "\r\n") into a malloc'd
 * NUL-terminated buffer (*outlen without the NUL) the caller must wipe (OPENSSL_cleanse) and
 * free.
 *
 * Always: a single Host header that names req->host (with :port when not 443) is required; the
 * hop-by-hop and framing headers (Connection, Keep-Alive, Proxy-*, TE, Trailer, Upgrade,
 * Expect, Transfer-Encoding, Content-Length) and Accept-Encoding are dropped and replaced by
 * "Connection: close", "Accept-Encoding: identity" (so the scrubber sees plain bytes) and the
 * framing the parser found (Content-Length N or Transfer-Encoding: chunked).
 *
 * With a credential (c and s non-NULL): req->host must match one of c's hosts, else -EACCES.
 * The guest's c->inject_header, when it holds "cove-credential:NAME" (NAME = c->name), gets the
 * placeholder replaced by the password; inside a "Basic " value the placeholder is looked for
 * in the base64-decoded "user:password" text and the result is encoded again (what git sends).
 * Otherwise c->inject_header is set to c->inject_template with {password} and {username} filled;
 * a template "Basic {username}:{password}" (any template starting "Basic ") has the filled text
 * after "Basic " base64-encoded. A placeholder anywhere else (the target, any other header, a
 * placeholder naming another credential) is refused with -EACCES. The body is never touched.
 *
 * Without a credential the head is normalized the same way and a placeholder is refused too.
 * Returns 0, -EACCES (refused: err says why, without any header value), -EINVAL (bad head),
 * -E2BIG or -ENOMEM.
 */
int inject_build_head(const struct inject_req *req, const struct cred_policy *c,
		      const struct secret *s, char **out, size_t *outlen, char *err, size_t errlen);

/* Adds what must never reach the guest to sc: the password, the username when the template uses
 * it, and "username:password" (scrub_add adds their base64, hex and escaped forms). Returns 0 or
 * -ENOMEM/-ENOSPC. */
int inject_scrubber(struct scrubber *sc, const struct cred_policy *c, const struct secret *s);

#endif
