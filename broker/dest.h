/* Destination checks: resolve a host once, refuse private addresses, pin what was checked. */
#ifndef COVE_BROKER_DEST_H
#define COVE_BROKER_DEST_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#define DEST_MAX_ADDRS 16

/* True for loopback, private (RFC 1918, ULA), link-local, CGNAT, unspecified, multicast,
 * reserved/benchmark ranges, and IPv4-mapped/NAT64 forms of those. */
bool dest_addr_is_private(const struct sockaddr *sa);

/* Resolves host (all addresses). When !allow_private and any address is private, returns
 * -EACCES. On success writes a CURLOPT_RESOLVE entry "host:port:addr[,addr...]" to pin
 * (empty for IP literals, which need no DNS). Returns 0, -EACCES or -ENOENT (no address). */
int dest_resolve(const char *host, int port, bool allow_private, char *pin, size_t pincap);

#endif
