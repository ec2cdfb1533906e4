/* Destination address policy. Every resolved address is checked, and the same addresses are
 * handed to curl (CURLOPT_RESOLVE) so a second DNS answer cannot swap in a private one. */
#include "dest.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static bool v4_private(uint32_t a)
{
	return (a >> 24) == 0 ||		    /* 0.0.0.0/8 */
	       (a >> 24) == 10 ||		    /* 10/8 */
	       (a >> 22) == (100u << 2 | 1) ||	    /* 100.64/10 CGNAT */
	       (a >> 24) == 127 ||		    /* loopback */
	       (a >> 16) == (169u << 8 | 254) ||    /* link-local */
	       (a >> 20) == (172u << 4 | 1) ||	    /* 172.16/12 */
	       (a >> 8) == (192u << 16 | 0 << 8) || /* 192.0.0/24 */
	       (a >> 16) == (192u << 8 | 168) ||    /* 192.168/16 */
	       (a >> 17) == (198u << 7 | 9) ||	    /* 198.18/15 benchmarking */
	       (a >> 28) >= 14;			    /* 224/4 multicast, 240/4 reserved */
}

bool dest_addr_is_private(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return v4_private(ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr));
	if (sa->sa_family == AF_INET6) {
		const uint8_t *b = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
		static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
		static const uint8_t nat64[12] = {0, 0x64, 0xff, 0x9b};
		static const uint8_t zero[16];
		uint32_t v4;

		if (!memcmp(b, mapped, 12) || !memcmp(b, nat64, 12)) {
			v4 = (uint32_t)b[12] << 24 | (uint32_t)b[13] << 16 | (uint32_t)b[14] << 8 |
			     b[15];
			return v4_private(v4);
		}
		if (!memcmp(b, zero, 15) && (b[15] == 0 || b[15] == 1)) /* :: and ::1 */
			return true;
		if (!memcmp(b, zero, 12)) /* deprecated IPv4-compatible */
			return true;
		return (b[0] & 0xfe) == 0xfc ||			  /* fc00::/7 ULA */
		       (b[0] == 0xfe && (b[1] & 0xc0) == 0x80) || /* fe80::/10 link-local */
		       (b[0] == 0xfe && (b[1] & 0xc0) == 0xc0) || /* fec0::/10 site-local */
		       b[0] == 0xff;				  /* multicast */
	}
	return true; /* anything else is not a public internet address */
}

/* True when addr is already one of the comma-separated entries of list. */
static bool addr_listed(const char *list, const char *addr)
{
	size_t n = strlen(addr);
	const char *p;

	for (p = list; *p; p += strcspn(p, ",") + (p[strcspn(p, ",")] == ',')) {
		const char *e = p + strcspn(p, ",");
		const char *a = p;
		size_t l = (size_t)(e - p);

		if (*a == '[') { /* IPv6 entries are bracketed */
			a++;
			l -= 2;
		}
		if (l == n && !memcmp(a, addr, n))
			return true;
	}
	return false;
}

int dest_resolve(const char *host, int port, bool allow_private, char *pin, size_t pincap)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *ai;
	unsigned char tmp[16];
	bool literal = inet_pton(AF_INET, host, tmp) == 1 || inet_pton(AF_INET6, host, tmp) == 1;
	size_t o, start, naddr = 0;
	int r, n;

	if (literal)
		hints.ai_flags = AI_NUMERICHOST;
	if (getaddrinfo(host, NULL, &hints, &res))
		return -ENOENT;
	n = snprintf(pin, pincap, "%s:%d:", host, port);
	o = n > 0 && (size_t)n < pincap ? (size_t)n : pincap;
	start = o;
	r = 0;
	for (ai = res; ai && naddr < DEST_MAX_ADDRS; ai = ai->ai_next) {
		char a[INET6_ADDRSTRLEN];
		const void *src;

		if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6)
			continue;
		if (!allow_private && dest_addr_is_private(ai->ai_addr)) {
			r = -EACCES;
			break;
		}
		src = ai->ai_family == AF_INET
			  ? (const void *)&((struct sockaddr_in *)ai->ai_addr)->sin_addr
			  : (const void *)&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr;
		if (!inet_ntop(ai->ai_family, src, a, sizeof(a)))
			continue;
		if (addr_listed(pin + start, a)) /* getaddrinfo repeats addresses */
			continue;
		n = snprintf(pin + o, pincap - o, ai->ai_family == AF_INET6 ? "%s[%s]" : "%s%s",
			     naddr ? "," : "", a);
		if (n < 0 || (size_t)n >= pincap - o)
			break;
		o += (size_t)n;
		naddr++;
	}
	freeaddrinfo(res);
	if (!r && !naddr)
		r = -ENOENT;
	if (r || literal)
		pin[0] = '\0';
	return r;
}
