/* Destination checks: resolve a host once, refuse private addresses, pin what was checked. */
#ifndef COVE_BROKER_DEST_H
#define COVE_BROKER_DEST_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#define DEST_MAX_ADDRS 16

struct dest_addrs {
	struct sockaddr_storage a[DEST_MAX_ADDRS];
	socklen_t len[DEST_MAX_ADDRS];
	size_t n;
};

/* True for loopback, private (RFC 1918, ULA), link-local, CGNAT, unspecified, multicast,
 * reserved, benchmark and documentation ranges (IPv4 and IPv6), local-use NAT64
 * (64:ff9b:1::/48), and the IPv4-mapped, NAT64, IPv4-compatible and 6to4 forms of a private
 * IPv4 address. */
bool dest_addr_is_private(const struct sockaddr *sa);

/* Resolves host (all addresses). When !allow_private and any address is private, returns
 * -EACCES. On success writes a CURLOPT_RESOLVE entry "host:port:addr[,addr...]" to pin
 * (empty for IP literals, which need no DNS). Returns 0, -EACCES or -ENOENT (no address). */
int dest_resolve(const char *host, int port, bool allow_private, char *pin, size_t pincap);

/* Resolves host once (getaddrinfo; numeric only for IP literals) into out, without repeats,
 * ports set to port. When !allow_private and any address is private, returns -EACCES (no
 * address kept). Returns 0, -EACCES or -ENOENT (no address). The addresses are the ones to
 * connect to: never resolve again, so what was checked is what is used. */
int dest_lookup(const char *host, int port, bool allow_private, struct dest_addrs *out);

/* Connects (blocking, each address in turn, within timeout_ms for all of them) to one of the
 * addresses of a dest_lookup, checking each address again against allow_private. A readable
 * stop_fd (-1: none) gives up with -ECANCELED. Returns the connected socket (CLOEXEC,
 * blocking) with *used set to its index, or -errno of the last try. */
int dest_connect(const struct dest_addrs *d, bool allow_private, int timeout_ms, int stop_fd,
		 size_t *used);

#endif
