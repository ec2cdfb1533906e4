/* The per-session credential policy: loading the JSON file and checking requests against it. */
#ifndef COVE_BROKER_POLICY_H
#define COVE_BROKER_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "egress_policy.h"
#include "url.h"

#define POLICY_MAX_LIST	 64
#define POLICY_FILE_MAX	 (1u << 20)
#define POLICY_MAX_CREDS 256

struct strlist {
	char **v;
	size_t n;
};

struct cred_policy {
	char *name;
	struct strlist helper;	   /* argv; "get" is appended when run */
	struct strlist input_keys; /* helper_input, in file order */
	struct strlist input_vals;
	char *inject_header;	    /* e.g. "Authorization" */
	char *inject_template;	    /* e.g. "Bearer {password}" */
	struct strlist schemes;	    /* default ["https"] */
	struct strlist hosts;	    /* exact or "*.suffix"; required */
	int ports[POLICY_MAX_LIST]; /* empty = the scheme's default port only */
	size_t nports;
	struct strlist path_prefixes; /* default ["/"] */
	struct strlist methods;	      /* default ["GET"] */
	struct strlist headers;	      /* request header names the guest may send */
	bool path_params;	      /* allow ';' parameters in path segments */
	int64_t ttl_s;		      /* 0 = no expiry */
	uint32_t rate_per_min;	      /* 0 = unlimited */
	uint64_t max_uses;	      /* 0 = unlimited */
	bool allow_private;
	char *ca_file; /* PEM bundle that replaces the system CAs for https (optional) */

	/* usage state */
	uint64_t uses;
	int64_t *rate_ring; /* monotonic ns of the last rate_per_min uses */
	uint32_t rate_head, rate_count;
};

struct policy {
	struct cred_policy *creds;
	size_t ncreds;
	struct egress_policy egress; /* no "egress" section: no rule, nothing allowed */
};

/* Parses a policy document. Unknown keys, wrong types and bad values fail with one line in err. */
int policy_parse(const char *text, size_t len, struct policy *out, char *err, size_t errlen);
/* Reads and parses a policy file (capped at POLICY_FILE_MAX). */
int policy_load(const char *path, struct policy *out, char *err, size_t errlen);
void policy_free(struct policy *p);

struct cred_policy *policy_find(struct policy *p, const char *name);

/* True when host matches pattern: exact (case-insensitive) or "*.suffix" (any subdomain). */
bool policy_host_match(const char *pattern, const char *host);

/* Checks a request. Returns NULL when allowed, else the denial reason ("host not allowed", ...).
 * now_ns and start_ns are CLOCK_MONOTONIC; start_ns is broker start or the last grant. */
const char *policy_check(const struct cred_policy *c, const struct url_parts *u, const char *method,
			 int64_t now_ns, int64_t start_ns);

/* Canonical form of a URL path for prefix matching: each segment percent-decoded, ';'
 * parameters refused (or, with allow_params, cut off). Refuses (-EINVAL, *why set) what a server
 * could read differently from the broker: dot segments in any spelling ("..", "%2e.", "..;x"),
 * bad escapes, and decoded '/', '\\', '%', ';' or control bytes. out holds cap bytes. */
int policy_path_canon(const char *path, bool allow_params, char *out, size_t cap, const char **why);

/* True when the guest may send this "Name: value" header under c: its name is in c's
 * allow.headers, and it is neither a header that changes where or how the request goes
 * (Host, framing, X-HTTP-Method-Override, X-Forwarded-*, ...) nor c's inject header. */
bool policy_header_allowed(const struct cred_policy *c, const char *line);

/* Counts one use (for max_uses and the rate window). */
void policy_consume(struct cred_policy *c, int64_t now_ns);

#endif
