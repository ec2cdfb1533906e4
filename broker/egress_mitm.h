/* The egress proxy's interception: CONNECT tunnels to hosts a credential names end in the
 * broker (TLS from the per-sandbox CA), each request checked, audited and given its secret. */
#ifndef COVE_BROKER_EGRESS_MITM_H
#define COVE_BROKER_EGRESS_MITM_H

#include <stdbool.h>
#include <stddef.h>

#include "broker.h"
#include "egress.h"

/* True when b has a CA (--mitm-ca-dir) and some credential names host (policy_host_match on
 * its hosts) for https on port (its ports, or 443 when it lists none). */
bool egress_mitm_wanted(struct broker *b, const char *host, int port);

/*
 * Serves a CONNECT to host:port that egress_mitm_wanted: resolves once (private addresses only
 * when every credential naming the host has allow_private), connects once to find the address
 * that answers (its text into addr), answers "200", then runs mitm_serve to that address with
 * the first such credential's ca_file; every request in the tunnel is decided by the policy
 * (policy_check under b->lock with the current grant, the header allowlist, policy_consume),
 * its secret fetched with helper_run, and audited as one "egress-inject" record. *status: what
 * the guest was answered (403 or 502 before the tunnel: the caller sends it; 200 after).
 * Returns 0 or -errno with one line in why (never a header value or a secret).
 */
int egress_mitm_serve(struct broker *b, int gfd, int stop_fd, const char *host, int port,
		      int *status, char *addr, size_t addrcap, char *why, size_t whylen);

#endif
