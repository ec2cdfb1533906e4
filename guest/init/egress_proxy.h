/* egress_proxy.h: the guest's HTTP(S) proxy endpoint on 127.0.0.1:3128, relayed to the host. */
#ifndef COVE_EGRESS_PROXY_H
#define COVE_EGRESS_PROXY_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/log.h"

#define EGRESS_HOST_PORT   1026 /* host vsock port (CID 2): cove-broker's proxy side */
#define VSOCK_CONNECT_TIMEOUT_S 30 /* a guest connect to a host port waits this long (Linux: 2 s) */
#define EGRESS_LISTEN_PORT 3128
#define EGRESS_RELAYS_MAX  256

/*
 * One listener on 127.0.0.1:port. Each accepted connection is relayed byte for byte, on its own
 * thread, to vsock CID 2 port 1026 (test mode: the Unix socket <test_uds>_1026); nothing here
 * parses HTTP: the host side speaks the proxy protocol and applies the policy.
 */
struct egress_proxy {
	/* set by the caller before egress_proxy_start */
	const char *test_uds; /* NULL in the guest */
	uint16_t port;	      /* 0: any free port; the bound port is stored back here */
	unsigned max_relays;  /* 0: EGRESS_RELAYS_MAX; a connection beyond it is closed at once */
	struct logger *log;
	/* owned by egress_proxy.c */
	pthread_mutex_t lock;
	pthread_cond_t idle; /* active dropped to 0 */
	pthread_t accept_th;
	int lfd;
	unsigned active;
	unsigned long accepted, refused, upstream_failed; /* counters, for tests and logs */
	bool stopping;
};

/* Binds and listens, then accepts on a thread of its own. 0 or -errno (nothing left open). */
int egress_proxy_start(struct egress_proxy *p);
/* Tests only: stops accepting, then waits until every relay has ended (their peers closed). */
void egress_proxy_stop(struct egress_proxy *p);

/*
 * egress_env.c: the proxy variables every program cove-init starts gets by default:
 * http_proxy, https_proxy, HTTP_PROXY, HTTPS_PROXY = http://127.0.0.1:PORT, no_proxy and
 * NO_PROXY = localhost,127.0.0.1,::1.
 */
#define EGRESS_ENV_COUNT 6
/* "NAME=VALUE" of variable i (< EGRESS_ENV_COUNT) into buf; 0, -ENOENT or -ENOSPC. */
int egress_env_entry(unsigned i, uint16_t port, char *buf, size_t size);
/*
 * ca_env.c: SSL_CERT_FILE and REQUESTS_CA_BUNDLE name the first trust bundle the root has
 * (proto/trust_paths.h), NODE_EXTRA_CA_CERTS the sandbox's CA certificate, so that Python,
 * requests and Node trust the egress interception in any image. "NAME=VALUE" of variable i
 * (< CA_ENV_COUNT) into buf; -ENOENT when the root has no such file.
 */
#define CA_ENV_COUNT 3
int ca_env_entry(unsigned i, char *buf, size_t size);
/* setenv() each variable the environment does not already have (PID 1: boot parameters win). */
int egress_env_setdefault(uint16_t port);

#endif
