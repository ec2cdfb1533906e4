/* The egress section of the broker's policy: which hosts, ports and methods the guest's HTTP
 * proxy may reach, and the per-connection limits. */
#ifndef COVE_BROKER_EGRESS_POLICY_H
#define COVE_BROKER_EGRESS_POLICY_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EGRESS_MAX_RULES     256
#define EGRESS_MAX_LIST	     64
#define EGRESS_METHOD_MAX    16
#define EGRESS_HOST_MAX	     253
#define EGRESS_MAX_CONNS_CAP 256 /* max_connections may not go over this */
#define EGRESS_DEF_CONNS     16
#define EGRESS_DEF_BYTES     (1ULL << 30) /* per connection and direction */
#define EGRESS_DEF_IDLE_S    60

struct egress_rule {
	char host[EGRESS_HOST_MAX + 1]; /* exact (lower case) or "*.suffix" */
	int ports[EGRESS_MAX_LIST];
	size_t nports;
	char methods[EGRESS_MAX_LIST][EGRESS_METHOD_MAX + 1]; /* "CONNECT" for tunnels */
	size_t nmethods;
	bool allow_private;
};

struct egress_policy {
	struct egress_rule *rules; /* NULL and nrules 0: nothing is allowed */
	size_t nrules;
	uint32_t max_connections; /* concurrent */
	uint64_t max_bytes;	  /* per connection, each direction on its own */
	uint32_t idle_timeout_s;  /* no byte either way for this long closes the connection */
};

/* Defaults for a policy without an egress section: no rule, default limits. */
void egress_policy_init(struct egress_policy *e);

/* Parses the "egress" object. Unknown keys, wrong types and bad values fail with one line in
 * err. Returns 0, -EINVAL or -ENOMEM; call egress_policy_free either way. */
int egress_policy_parse(json_t *o, struct egress_policy *e, char *err, size_t errlen);
void egress_policy_free(struct egress_policy *e);

/* The first rule that allows method to host:port (host lower case, IPv6 without brackets).
 * Returns its index, or -1 with a reason in why: "no egress rule allows HOST:PORT" or
 * "egress rule N does not allow METHOD" when a rule names host:port but not the method. */
int egress_match(const struct egress_policy *e, const char *host, int port, const char *method,
		 char *why, size_t whylen);

#endif
