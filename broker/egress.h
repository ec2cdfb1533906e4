/* cove-broker's egress proxy: the host side of the guest's HTTP proxy. Each connection on the
 * egress socket carries one proxy request (CONNECT host:port, or an absolute-form http://
 * request) that is checked against the policy's egress rules, connected to a pinned, checked
 * address, relayed byte for byte and audited. A thread per connection, capped by the policy's
 * max_connections, so the event loop (guest requests, grants) never waits for it. */
#ifndef COVE_BROKER_EGRESS_H
#define COVE_BROKER_EGRESS_H

#include "broker.h"

#define EGRESS_HEAD_TIMEOUT_MS	  10000	      /* to send the whole request head */
#define EGRESS_CONNECT_TIMEOUT_MS 10000	      /* for all of a host's addresses together */
#define EGRESS_LINGER_MS	  500	      /* after a refusal, reading the guest's rest */
#define EGRESS_LINGER_BYTES	  (64 * 1024) /* ... at most this much */
#define EGRESS_THREAD_STACK	  (256 * 1024)

struct egress_server;

/* Starts serving listen_fd (a listening Unix socket, which stays the caller's) with b's egress
 * policy, audit log and logger, which must outlive egress_stop. Returns 0 or -errno. */
int egress_start(struct broker *b, int listen_fd, struct egress_server **out);

/* Stops accepting, ends every connection (audited as "broker stopping"), waits for their
 * threads and frees s. NULL is a no-op. */
void egress_stop(struct egress_server *s);

/* Serves one accepted connection to its end (blocking): used by the server's threads. */
void egress_serve(struct broker *b, int guest_fd, int stop_fd);

/* Refuses one connection at once with status and the one-line reason, and audits it. */
void egress_refuse(struct broker *b, int guest_fd, int status, const char *reason);

#endif
