/* Destination address policy. Every resolved address is checked, and the same addresses are
 * handed to curl (CURLOPT_RESOLVE) so a second DNS answer cannot swap in a private one. */
#include "dest.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static bool v4_private(uint32_t a)
{
	return (a >> 24) == 0 ||			   /* 0.0.0.0/8 */
	       (a >> 24) == 10 ||			   /* 10/8 */
	       (a >> 22) == (100u << 2 | 1) ||		   /* 100.64/10 CGNAT */
	       (a >> 24) == 127 ||			   /* loopback */
	       (a >> 16) == (169u << 8 | 254) ||	   /* link-local */
	       (a >> 20) == (172u << 4 | 1) ||		   /* 172.16/12 */
	       (a >> 8) == (192u << 16 | 0 << 8) ||	   /* 192.0.0/24 */
	       (a >> 8) == (192u << 16 | 2) ||		   /* 192.0.2/24 TEST-NET-1 */
	       (a >> 8) == (198u << 16 | 51 << 8 | 100) || /* 198.51.100/24 TEST-NET-2 */
	       (a >> 8) == (203u << 16 | 0 << 8 | 113) ||  /* 203.0.113/24 TEST-NET-3 */
	       (a >> 16) == (192u << 8 | 168) ||	   /* 192.168/16 */
	       (a >> 17) == (198u << 7 | 9) ||		   /* 198.18/15 benchmarking */
	       (a >> 28) >= 14;				   /* 224/4 multicast, 240/4 reserved */
}

/* IPv6 blocks refused as a whole: none is a public internet destination. */
static const struct {
	uint8_t p[6];
	unsigned bits;
} v6_blocked[] = {
    {{0x00, 0x64, 0xff, 0x9b, 0x00, 0x01}, 48}, /* 64:ff9b:1::/48 local-use NAT64 */
    {{0x20, 0x01, 0x0d, 0xb8}, 32},		/* 2001:db8::/32 documentation */
    {{0x3f, 0xff, 0x00}, 20},			/* 3fff::/20 documentation */
    {{0x20, 0x01, 0x00, 0x02, 0x00, 0x00}, 48}, /* 2001:2::/48 benchmarking */
};

static bool v6_prefix(const uint8_t *a, const uint8_t *p, unsigned bits)
{
	unsigned whole = bits / 8, rest = bits % 8;

	return !memcmp(a, p, whole) &&
	       (!rest || ((a[whole] ^ p[whole]) & (uint8_t)(0xff << (8 - rest))) == 0);
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
		/* 6to4 (2002::/16) holds in bits 16-47 the IPv4 address a relay tunnels the packet
		 * to: it is that address that is reached. */
		if (b[0] == 0x20 && b[1] == 0x02)
			return v4_private((uint32_t)b[2] << 24 | (uint32_t)b[3] << 16 |
					  (uint32_t)b[4] << 8 | b[5]);
		for (size_t i = 0; i < sizeof(v6_blocked) / sizeof(v6_blocked[0]); i++)
			if (v6_prefix(b, v6_blocked[i].p, v6_blocked[i].bits))
				return true;
		return (b[0] & 0xfe) == 0xfc ||			  /* fc00::/7 ULA */
		       (b[0] == 0xfe && (b[1] & 0xc0) == 0x80) || /* fe80::/10 link-local */
		       (b[0] == 0xfe && (b[1] & 0xc0) == 0xc0) || /* fec0::/10 site-local */
		       b[0] == 0xff;				  /* multicast */
	}
	return true; /* anything else is not a public internet address */
}

static bool same_addr(const struct sockaddr *a, const struct sockaddr *b)
{
	if (a->sa_family != b->sa_family)
		return false;
	if (a->sa_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
		       &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr));
}

int dest_lookup(const char *host, int port, bool allow_private, struct dest_addrs *out)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *ai;
	unsigned char tmp[16];
	int r = 0;

	out->n = 0;
	if (inet_pton(AF_INET, host, tmp) == 1 || inet_pton(AF_INET6, host, tmp) == 1)
		hints.ai_flags = AI_NUMERICHOST;
	if (getaddrinfo(host, NULL, &hints, &res))
		return -ENOENT;
	for (ai = res; ai && out->n < DEST_MAX_ADDRS; ai = ai->ai_next) {
		bool dup = false;

		if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6)
			continue;
		if (ai->ai_addrlen > sizeof(out->a[0]))
			continue;
		if (!allow_private && dest_addr_is_private(ai->ai_addr)) {
			r = -EACCES;
			break;
		}
		for (size_t i = 0; i < out->n && !dup; i++) /* getaddrinfo repeats addresses */
			dup = same_addr((struct sockaddr *)&out->a[i], ai->ai_addr);
		if (dup)
			continue;
		memcpy(&out->a[out->n], ai->ai_addr, ai->ai_addrlen);
		out->len[out->n] = ai->ai_addrlen;
		if (ai->ai_family == AF_INET)
			((struct sockaddr_in *)&out->a[out->n])->sin_port = htons((uint16_t)port);
		else
			((struct sockaddr_in6 *)&out->a[out->n])->sin6_port = htons((uint16_t)port);
		out->n++;
	}
	freeaddrinfo(res);
	if (r)
		out->n = 0;
	else if (!out->n)
		r = -ENOENT;
	return r;
}

int dest_resolve(const char *host, int port, bool allow_private, char *pin, size_t pincap)
{
	struct dest_addrs d;
	unsigned char tmp[16];
	bool literal = inet_pton(AF_INET, host, tmp) == 1 || inet_pton(AF_INET6, host, tmp) == 1;
	size_t o;
	int r, n;

	pin[0] = '\0';
	r = dest_lookup(host, port, allow_private, &d);
	if (r || literal)
		return r;
	n = snprintf(pin, pincap, "%s:%d:", host, port);
	o = n > 0 && (size_t)n < pincap ? (size_t)n : pincap;
	for (size_t i = 0; i < d.n; i++) {
		const struct sockaddr *sa = (const struct sockaddr *)&d.a[i];
		const void *src = sa->sa_family == AF_INET
				      ? (const void *)&((const struct sockaddr_in *)sa)->sin_addr
				      : (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr;
		char a[INET6_ADDRSTRLEN];

		if (!inet_ntop(sa->sa_family, src, a, sizeof(a)))
			continue;
		n = snprintf(pin + o, pincap - o, sa->sa_family == AF_INET6 ? "%s[%s]" : "%s%s",
			     i ? "," : "", a);
		if (n < 0 || (size_t)n >= pincap - o)
			break;
		o += (size_t)n;
	}
	return 0;
}

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* One nonblocking connect, waited for until deadline (CLOCK_MONOTONIC ms) or stop_fd. */
static int connect_one(const struct sockaddr *sa, socklen_t len, int64_t deadline, int stop_fd)
{
	int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), e = 0;
	socklen_t el = sizeof(e);

	if (fd < 0)
		return -errno;
	if (connect(fd, sa, len) && errno != EINPROGRESS) {
		e = -errno;
		goto fail;
	}
	for (;;) {
		struct pollfd p[2] = {{.fd = fd, .events = POLLOUT},
				      {.fd = stop_fd, .events = POLLIN}};
		int64_t left = deadline - mono_ms();
		int n;

		if (left <= 0) {
			e = -ETIMEDOUT;
			goto fail;
		}
		n = poll(p, 2, (int)left);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			e = -errno;
			goto fail;
		}
		if (p[1].revents) {
			e = -ECANCELED;
			goto fail;
		}
		if (p[0].revents)
			break;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) || e) {
		e = e ? -e : -errno;
		goto fail;
	}
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK)) {
		e = -errno;
		goto fail;
	}
	return fd;
fail:
	close(fd);
	return e;
}

int dest_connect(const struct dest_addrs *d, bool allow_private, int timeout_ms, int stop_fd,
		 size_t *used)
{
	int64_t deadline = mono_ms() + timeout_ms;
	int r = -ENOENT;

	for (size_t i = 0; i < d->n; i++) {
		const struct sockaddr *sa = (const struct sockaddr *)&d->a[i];

		if (!allow_private && dest_addr_is_private(sa)) {
			r = -EACCES;
			continue;
		}
		r = connect_one(sa, d->len[i], deadline, stop_fd);
		if (r >= 0) {
			*used = i;
			return r;
		}
		if (r == -ECANCELED || r == -ETIMEDOUT)
			break;
	}
	return r;
}
