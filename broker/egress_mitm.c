/* Interception in the egress proxy: a CONNECT to a host some credential names is answered by
 * the broker itself (TLS from the per-sandbox CA, mitm_tls.c), and each request in it is
 * checked against that credential's policy, audited, and sent upstream with the secret. */
#include "egress_mitm.h"
#include "dest.h"
#include "helper.h"
#include "mitm_tls.h"
#include "url.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define ICPT_MAX_CANDS 16 /* credentials that may name one host */

struct icpt {
	struct broker *b;
	const char *host;
	int port;
	struct cred_policy *cand[ICPT_MAX_CANDS];
	size_t ncand;
	/* The current request's decision, audited with its outcome when it is over (requests in a
	 * tunnel come one after another). */
	const char *p_cred, *p_decision;
	char p_reason[300];
};

static bool port_ok(const struct cred_policy *c, int port)
{
	size_t i;

	if (!c->nports)
		return port == 443;
	for (i = 0; i < c->nports; i++)
		if (c->ports[i] == port)
			return true;
	return false;
}

static bool https_ok(const struct cred_policy *c)
{
	size_t i;

	for (i = 0; i < c->schemes.n; i++)
		if (!strcmp(c->schemes.v[i], "https"))
			return true;
	return false;
}

static bool names_host(const struct cred_policy *c, const char *host, int port)
{
	size_t i;

	if (!https_ok(c) || !port_ok(c, port))
		return false;
	for (i = 0; i < c->hosts.n; i++)
		if (policy_host_match(c->hosts.v[i], host))
			return true;
	return false;
}

/* The credentials naming host:port for https, in policy order (at most ICPT_MAX_CANDS). */
static size_t candidates(struct broker *b, const char *host, int port,
			 struct cred_policy **out)
{
	size_t i, n = 0;

	for (i = 0; i < b->pol.ncreds && n < ICPT_MAX_CANDS; i++)
		if (names_host(&b->pol.creds[i], host, port))
			out[n++] = &b->pol.creds[i];
	return n;
}

bool egress_mitm_wanted(struct broker *b, const char *host, int port)
{
	struct cred_policy *c[ICPT_MAX_CANDS];

	return b->mitm_ca && candidates(b, host, port, c) > 0;
}

/* Headers the proxy itself handles (inject_build_head checks Host, drops and replaces the
 * framing and hop-by-hop ones and Accept-Encoding; the inject header carries the placeholder):
 * the credential's header allowlist applies to every other one. */
static bool proxy_handles(const struct cred_policy *c, const char *name)
{
	static const char *const own[] = {"Host",    "Connection",	  "Keep-Alive",
					  "TE",	     "Trailer",		  "Upgrade",
					  "Expect",  "Transfer-Encoding", "Content-Length",
					  "Accept-Encoding", NULL};
	size_t i;

	if (!strncasecmp(name, "Proxy-", 6))
		return true;
	if (c->inject_header && !strcasecmp(name, c->inject_header))
		return true;
	for (i = 0; own[i]; i++)
		if (!strcasecmp(name, own[i]))
			return true;
	return false;
}

/* One "egress-inject" record: never a header value or the secret. The target is cut at
 * AUDIT_URL_MAX bytes. */
static void audit_inject(struct icpt *x, const struct mitm_request *rq, const char *cred,
			 const char *decision, const char *reason, int status)
{
	struct broker *b = x->b;
	json_t *o = json_object();
	char path[AUDIT_URL_MAX + 1];
	int r = -ENOMEM;

	snprintf(path, sizeof(path), "%s", rq->target);
	for (char *p = path; *p; p++)
		if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
			*p = '?';
	if (o && !json_object_set_new(o, "kind", json_string("egress-inject")) &&
	    !json_object_set_new(o, "host", json_string(x->host)) &&
	    !json_object_set_new(o, "port", json_integer(x->port)) &&
	    !json_object_set_new(o, "method", json_string(rq->method)) &&
	    !json_object_set_new(o, "path", json_string(path)) &&
	    !json_object_set_new(o, "credential", cred ? json_string(cred) : json_null()) &&
	    !json_object_set_new(o, "decision", json_string(decision)) &&
	    !json_object_set_new(o, "reason", json_string(reason)) &&
	    !json_object_set_new(o, "status", json_integer(status)))
		r = audit_append_fields(&b->audit, o);
	json_decref(o);
	if (r)
		broker_log(b, LOG_ERROR, "egress-inject: audit write failed: %s", strerror(-r));
	broker_log(b, strcmp(decision, "allow") ? LOG_INFO : LOG_DEBUG,
		   "egress-inject %s %s %s: %s %s", rq->method, x->host, cred ? cred : "-",
		   decision, reason);
}

static void pending(struct icpt *x, const char *cred, const char *decision, const char *reason)
{
	x->p_cred = cred;
	x->p_decision = decision;
	snprintf(x->p_reason, sizeof(x->p_reason), "%s", reason);
}

/* https://host:port/target (IPv6 in brackets) into u: 0 or -EINVAL. */
static int split_target(const struct icpt *x, const char *target, struct url_parts *u)
{
	char url[URL_MAX + 1], err[128];
	bool v6 = strchr(x->host, ':') != NULL;
	int n;

	if (target[0] != '/')
		return -EINVAL;
	n = snprintf(url, sizeof(url), "https://%s%s%s:%d%s", v6 ? "[" : "", x->host,
		     v6 ? "]" : "", x->port, target);
	if (n < 0 || (size_t)n >= sizeof(url))
		return -EINVAL;
	return url_split(url, u, err, sizeof(err)) ? -EINVAL : 0;
}

/* The decision for one request in the tunnel: the first candidate credential whose policy
 * allows it (the same policy_check, grant and TTL origin as the fetch path; the use counted
 * under the broker's lock), its header allowlist, then its helper for the secret. */
static int icpt_decide(void *arg, const struct mitm_request *rq, const struct cred_policy **cred,
		       struct secret *sec, char *err, size_t errlen)
{
	struct icpt *x = arg;
	struct broker *b = x->b;
	struct url_parts u = {0};
	struct cred_policy *c = NULL;
	const char *why = "no credential allows it", *first = NULL;
	char reason[300], herr[256];
	int64_t now = broker_now_ns();
	size_t i, k;
	int r;

	*cred = NULL;
	if (split_target(x, rq->target, &u)) {
		why = "malformed request target";
		goto deny;
	}
	/* The target goes upstream as the guest sent it: it must be what was checked (the fetch
	 * path sends curl's normalized URL; here a "/v1/../admin" would be checked as "/admin"
	 * but a server might read it otherwise). */
	if (strlen(u.path) != strcspn(rq->target, "?#") ||
	    memcmp(u.path, rq->target, strlen(u.path))) {
		why = "request path not in normal form (dot segments)";
		goto deny;
	}
	pthread_mutex_lock(&b->lock);
	if (!b->have_token) {
		pthread_mutex_unlock(&b->lock);
		why = "stale epoch (no grant yet)";
		goto deny;
	}
	for (i = 0; i < x->ncand && !c; i++) {
		const char *w = policy_check(x->cand[i], &u, rq->method, now, b->start_ns);

		if (!w)
			c = x->cand[i];
		else if (!first)
			first = w;
	}
	if (!c) {
		pthread_mutex_unlock(&b->lock);
		why = first ? first : why;
		goto deny;
	}
	for (k = 0; k < rq->nh; k++) {
		const char *name = rq->h[k].name;

		if (!proxy_handles(c, name) && !policy_header_allowed(c, name)) {
			pthread_mutex_unlock(&b->lock);
			snprintf(reason, sizeof(reason), "header %.64s not allowed", name);
			for (char *p = reason; *p; p++)
				if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
					*p = '?';
			why = reason;
			goto deny_cred;
		}
	}
	policy_consume(c, now);
	pthread_mutex_unlock(&b->lock);
	url_parts_free(&u);

	r = helper_run(c, b->helper_timeout_ms, sec, herr, sizeof(herr));
	if (r) {
		secret_wipe(sec);
		broker_log(b, LOG_WARN, "credential %s: %s", c->name, herr);
		pending(x, c->name, "deny", "credential helper failed");
		snprintf(err, errlen, "credential helper failed");
		return -EIO;
	}
	*cred = c;
	pending(x, c->name, "allow", "credential injected");
	return 0;
deny_cred:
	url_parts_free(&u);
	pending(x, c->name, "deny", why);
	snprintf(err, errlen, "cove-egress: denied: %s", why);
	return -EACCES;
deny:
	url_parts_free(&u);
	pending(x, NULL, "deny", why);
	snprintf(err, errlen, "cove-egress: denied: %s", why);
	return -EACCES;
}

/* The request is over: its one record, with what the guest got. */
static void icpt_done(void *arg, const struct mitm_request *rq, int status, int result)
{
	struct icpt *x = arg;

	(void)result;
	audit_inject(x, rq, x->p_cred, x->p_decision ? x->p_decision : "deny",
		     x->p_decision ? x->p_reason : "not decided", status);
	x->p_cred = x->p_decision = NULL;
}

int egress_mitm_serve(struct broker *b, int gfd, int stop_fd, const char *host, int port,
		      int *status, char *addr, size_t addrcap, char *why, size_t whylen)
{
	struct icpt x = {.b = b, .host = host, .port = port};
	struct mitm_upstream up = {0};
	struct dest_addrs d;
	const struct sockaddr *sa;
	bool allow_private = true;
	size_t i, used = 0;
	int r, fd;
	static const char ok[] = "HTTP/1.1 200 Connection established\r\n\r\n";

	*status = 403;
	x.ncand = candidates(b, host, port, x.cand);
	if (!x.ncand || !b->mitm_ca) {
		snprintf(why, whylen, "no credential names %s port %d", host, port);
		return -ENOENT;
	}
	/* Private addresses only when every credential that may be used here allows them. */
	for (i = 0; i < x.ncand; i++)
		allow_private = allow_private && x.cand[i]->allow_private;
	r = dest_lookup(host, port, allow_private, &d);
	if (r == -EACCES) {
		snprintf(why, whylen,
			 "%s resolves to a private, loopback or link-local address (credential "
			 "%s has no allow_private)",
			 host, x.cand[0]->name);
		return -EACCES;
	}
	*status = 502;
	if (r) {
		snprintf(why, whylen, "cannot resolve %s", host);
		return -EHOSTUNREACH;
	}
	/* One connection to find an address that answers (a CONNECT that cannot reach the
	 * upstream is a 502, as on the plain egress path); mitm_serve opens its own per request to
	 * exactly that address. */
	fd = dest_connect(&d, allow_private, EGRESS_CONNECT_TIMEOUT_MS, stop_fd, &used);
	if (fd < 0) {
		snprintf(why, whylen, "upstream: connect to %s port %d failed: %s", host, port,
			 strerror(-fd));
		return -EHOSTUNREACH;
	}
	close(fd);
	sa = (const struct sockaddr *)&d.a[used];
	inet_ntop(sa->sa_family,
		  sa->sa_family == AF_INET
		      ? (const void *)&((const struct sockaddr_in *)sa)->sin_addr
		      : (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr,
		  addr, (socklen_t)addrcap);
	*status = 200;
	if (send(gfd, ok, sizeof(ok) - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof(ok) - 1)) {
		snprintf(why, whylen, "guest went away");
		return -EPIPE;
	}
	up.host = host;
	up.port = (unsigned)port;
	up.addr = sa;
	up.addrlen = d.len[used];
	up.ca_file = x.cand[0]->ca_file;
	up.decide = icpt_decide;
	up.done = icpt_done;
	up.arg = &x;
	r = mitm_serve(b->mitm_ca, gfd, &up, why, whylen);
	if (!r)
		snprintf(why, whylen, "intercepted (credential %s)", x.cand[0]->name);
	return r;
}
