/* TLS termination for the egress proxy: the guest's TLS ends here (a leaf from the sandbox CA),
 * each HTTP/1.1 request gets its credential injected and goes upstream over verified TLS, and
 * the response comes back scrubbed. */
#ifndef COVE_BROKER_MITM_TLS_H
#define COVE_BROKER_MITM_TLS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "helper.h"
#include "inject.h"
#include "mitm_ca.h"
#include "policy.h"

#define MITM_HEAD_MAX	   (32 * 1024)	 /* a guest request head */
#define MITM_RESP_HEAD_MAX (64 * 1024)	 /* an upstream response head */
#define MITM_FLUSH_AT	   (64 * 1024)	 /* response body scrubbed and sent in pieces of */
#define MITM_SCRUB_RUN_MAX (1024 * 1024) /* body bytes held while no safe cut is found */
#define MITM_TIMEOUT_MS	   30000

/* What the guest asked for, handed to the decision callback before anything goes upstream. */
struct mitm_request {
	const char *host; /* the CONNECT host (certificate name, Host header, policy host) */
	unsigned port;
	const char *method;
	const char *target; /* origin-form path and query, as the guest sent it */
	const struct inject_hdr *h; /* the guest's headers, as parsed (for an allowlist) */
	size_t nh;
};

/*
 * Decides one request: 0 to forward it, with *cred set to the credential to inject (or NULL:
 * none) and *sec filled (the caller of mitm_serve fetched it, e.g. with helper_run); mitm_serve
 * wipes *sec when the request is done. -EACCES denies it (the guest gets 403 and err as the
 * body); any other -errno gets 502. The callback is where the proxy applies policy_check,
 * policy_consume and its audit log.
 */
typedef int (*mitm_decide_fn)(void *arg, const struct mitm_request *rq,
			      const struct cred_policy **cred, struct secret *sec, char *err,
			      size_t errlen);

/* Called once for every request up->decide saw, when it is over: status is what the guest got
 * (the upstream's status once its head was relayed, else the proxy's own 403/502/...; 0 when
 * nothing was answered) and result 0 or the -errno that ended the tunnel. Where the proxy
 * writes its audit record with the outcome. */
typedef void (*mitm_done_fn)(void *arg, const struct mitm_request *rq, int status, int result);

struct mitm_upstream {
	const char *host; /* as in the CONNECT: SNI and the certificate name checked */
	unsigned port;
	const struct sockaddr *addr; /* the pinned address to connect to (the caller resolved and
					checked it) */
	socklen_t addrlen;
	const char *ca_file; /* PEM bundle replacing the system CAs (a policy's ca_file), or NULL */
	int timeout_ms;	     /* per socket read/write/connect; 0 = MITM_TIMEOUT_MS */
	mitm_decide_fn decide;
	mitm_done_fn done; /* optional */
	void *arg;
};

/*
 * Serves one CONNECT tunnel, blocking (a thread per tunnel): guest_fd is the connected socket
 * after the proxy's "200"; the TLS handshake is done with ca's leaf for up->host (TLS 1.2 or
 * later). Then, for each request: the head (at most MITM_HEAD_MAX, parsed with http-parser;
 * HTTP/1.1 only, no Upgrade) goes to up->decide (method, target); inject_build_head builds the
 * upstream head; a fresh upstream connection to up->addr is made with full certificate
 * verification (SSL_VERIFY_PEER, the name checked with SSL_set1_host or as an IP address), and
 * only then is the head sent, the body after it (re-framed). The response (head at most
 * MITM_RESP_HEAD_MAX; Content-Length, chunked or close-delimited body; a compressed body
 * refused) is relayed as it comes, scrubbed, its body re-framed chunked: pending bytes are cut
 * after a byte that no spelling of the secret contains (so no occurrence is ever split), in
 * pieces of about MITM_FLUSH_AT; a run of MITM_SCRUB_RUN_MAX bytes with no such byte fails it.
 * Failures before the response head went out become 400/403/431/502/505 answers and end the
 * tunnel; after it, a failure just closes the tunnel. Sets timeouts on guest_fd; does not close
 * it; blocks SIGPIPE in the calling thread while it runs. Returns 0 when the guest closed the
 * tunnel between requests or asked for Connection: close, else -errno with a one-line message
 * in err (never a header value or a secret).
 */
int mitm_serve(struct mitm_ca *ca, int guest_fd, const struct mitm_upstream *up, char *err,
	       size_t errlen);

#endif
