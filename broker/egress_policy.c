/* Parsing the policy's "egress" section (jansson) and matching a destination against it. */
#include "egress_policy.h"
#include "common/errmsg.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy.h"

void egress_policy_init(struct egress_policy *e)
{
	memset(e, 0, sizeof(*e));
	e->max_connections = EGRESS_DEF_CONNS;
	e->max_bytes = EGRESS_DEF_BYTES;
	e->idle_timeout_s = EGRESS_DEF_IDLE_S;
}

void egress_policy_free(struct egress_policy *e)
{
	free(e->rules);
	egress_policy_init(e);
}

/* A host pattern: letters, digits, '-', '.', '_' (or an IPv6 literal's hex and ':'), with an
 * optional leading "*." wildcard. */
static bool host_pattern_ok(const char *h)
{
	const char *p = h;

	if (!strncmp(p, "*.", 2))
		p += 2;
	if (!*p || strlen(h) > EGRESS_HOST_MAX || *p == '.')
		return false;
	for (; *p; p++)
		if (!isalnum((unsigned char)*p) && !strchr("-._:", *p))
			return false;
	return true;
}

static bool method_ok(const char *m)
{
	if (!*m || strlen(m) > EGRESS_METHOD_MAX)
		return false;
	for (; *m; m++)
		if (*m < 'A' || *m > 'Z')
			return false;
	return true;
}

static int parse_rule(json_t *o, size_t idx, struct egress_rule *r, char *err, size_t errlen)
{
	const char *k;
	json_t *v, *x;
	size_t i;

	if (!json_is_object(o))
		return errmsg(err, errlen, -EINVAL, "egress.rules[%zu] must be an object", idx);
	json_object_foreach(o, k, v)
	{
		if (!strcmp(k, "host")) {
			const char *h = json_string_value(v);

			if (!h || !host_pattern_ok(h))
				return errmsg(err, errlen, -EINVAL,
					      "egress.rules[%zu].host must be a host name, an IP "
					      "address or \"*.suffix\"",
					      idx);
			for (i = 0; h[i]; i++)
				r->host[i] = (char)tolower((unsigned char)h[i]);
			r->host[i] = '\0';
		} else if (!strcmp(k, "ports")) {
			if (!json_is_array(v) || !json_array_size(v) ||
			    json_array_size(v) > EGRESS_MAX_LIST)
				return errmsg(err, errlen, -EINVAL,
					      "egress.rules[%zu].ports must be an array of 1..%d "
					      "integers",
					      idx, EGRESS_MAX_LIST);
			json_array_foreach(v, i, x)
			{
				if (!json_is_integer(x) || json_integer_value(x) < 1 ||
				    json_integer_value(x) > 65535)
					return errmsg(err, errlen, -EINVAL,
						      "egress.rules[%zu].ports[%zu] must be an "
						      "integer 1..65535",
						      idx, i);
				r->ports[r->nports++] = (int)json_integer_value(x);
			}
		} else if (!strcmp(k, "methods")) {
			if (!json_is_array(v) || !json_array_size(v) ||
			    json_array_size(v) > EGRESS_MAX_LIST)
				return errmsg(err, errlen, -EINVAL,
					      "egress.rules[%zu].methods must be an array of 1..%d "
					      "strings",
					      idx, EGRESS_MAX_LIST);
			json_array_foreach(v, i, x)
			{
				const char *m = json_string_value(x);

				if (!m || !method_ok(m))
					return errmsg(err, errlen, -EINVAL,
						      "egress.rules[%zu].methods[%zu] must be an "
						      "upper-case method (CONNECT for tunnels)",
						      idx, i);
				strcpy(r->methods[r->nmethods++], m);
			}
		} else if (!strcmp(k, "allow_private")) {
			if (!json_is_boolean(v))
				return errmsg(err, errlen, -EINVAL,
					      "egress.rules[%zu].allow_private must be true or "
					      "false",
					      idx);
			r->allow_private = json_is_true(v);
		} else {
			return errmsg(err, errlen, -EINVAL, "egress.rules[%zu]: unknown key \"%s\"",
				      idx, k);
		}
	}
	if (!r->host[0] || !r->nports || !r->nmethods)
		return errmsg(err, errlen, -EINVAL,
			      "egress.rules[%zu] needs \"host\", \"ports\" and \"methods\"", idx);
	return 0;
}

static int parse_limit(json_t *v, const char *k, long long lo, long long hi, long long *out,
		       char *err, size_t errlen)
{
	if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
		return errmsg(err, errlen, -EINVAL, "egress.%s must be an integer %lld..%lld", k,
			      lo, hi);
	*out = json_integer_value(v);
	return 0;
}

int egress_policy_parse(json_t *o, struct egress_policy *e, char *err, size_t errlen)
{
	const char *k;
	json_t *v, *x;
	long long n;
	size_t i;
	int r;

	egress_policy_init(e);
	if (!json_is_object(o))
		return errmsg(err, errlen, -EINVAL, "policy: \"egress\" must be an object");
	json_object_foreach(o, k, v)
	{
		if (!strcmp(k, "rules")) {
			if (!json_is_array(v) || json_array_size(v) > EGRESS_MAX_RULES)
				return errmsg(err, errlen, -EINVAL,
					      "egress.rules must be an array of at most %d rules",
					      EGRESS_MAX_RULES);
			free(e->rules);
			e->nrules = 0;
			e->rules = calloc(json_array_size(v) + 1, sizeof(*e->rules));
			if (!e->rules)
				return -ENOMEM;
			json_array_foreach(v, i, x)
			{
				r = parse_rule(x, i, &e->rules[i], err, errlen);
				if (r)
					return r;
				e->nrules++;
			}
		} else if (!strcmp(k, "max_connections")) {
			if ((r = parse_limit(v, k, 1, EGRESS_MAX_CONNS_CAP, &n, err, errlen)))
				return r;
			e->max_connections = (uint32_t)n;
		} else if (!strcmp(k, "max_bytes")) {
			if ((r = parse_limit(v, k, 1, INT64_MAX, &n, err, errlen)))
				return r;
			e->max_bytes = (uint64_t)n;
		} else if (!strcmp(k, "idle_timeout_s")) {
			if ((r = parse_limit(v, k, 1, 86400, &n, err, errlen)))
				return r;
			e->idle_timeout_s = (uint32_t)n;
		} else {
			return errmsg(err, errlen, -EINVAL, "egress: unknown key \"%s\"", k);
		}
	}
	return 0;
}

int egress_match(const struct egress_policy *e, const char *host, int port, const char *method,
		 char *why, size_t whylen)
{
	int named = -1;

	for (size_t i = 0; i < e->nrules; i++) {
		const struct egress_rule *r = &e->rules[i];
		bool port_ok = false;

		if (!policy_host_match(r->host, host))
			continue;
		for (size_t j = 0; j < r->nports && !port_ok; j++)
			port_ok = r->ports[j] == port;
		if (!port_ok)
			continue;
		for (size_t j = 0; j < r->nmethods; j++)
			if (!strcmp(r->methods[j], method))
				return (int)i;
		if (named < 0)
			named = (int)i;
	}
	if (named >= 0)
		snprintf(why, whylen, "egress rule %d does not allow %s", named, method);
	else if (strchr(host, ':'))
		snprintf(why, whylen, "no egress rule allows [%s]:%d", host, port);
	else
		snprintf(why, whylen, "no egress rule allows %s:%d", host, port);
	return -1;
}
