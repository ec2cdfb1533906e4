/* Resource limits by name (rlimit_name.h). */
#include "common/rlimit_name.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>

#include "common/errmsg.h"

static const struct {
	const char *name;
	int resource;
} rlimits[] = {
    {"RLIMIT_AS", RLIMIT_AS},
    {"RLIMIT_CORE", RLIMIT_CORE},
    {"RLIMIT_CPU", RLIMIT_CPU},
    {"RLIMIT_DATA", RLIMIT_DATA},
    {"RLIMIT_FSIZE", RLIMIT_FSIZE},
    {"RLIMIT_LOCKS", RLIMIT_LOCKS},
    {"RLIMIT_MEMLOCK", RLIMIT_MEMLOCK},
    {"RLIMIT_MSGQUEUE", RLIMIT_MSGQUEUE},
    {"RLIMIT_NICE", RLIMIT_NICE},
    {"RLIMIT_NOFILE", RLIMIT_NOFILE},
    {"RLIMIT_NPROC", RLIMIT_NPROC},
    {"RLIMIT_RSS", RLIMIT_RSS},
    {"RLIMIT_RTPRIO", RLIMIT_RTPRIO},
    {"RLIMIT_RTTIME", RLIMIT_RTTIME},
    {"RLIMIT_SIGPENDING", RLIMIT_SIGPENDING},
    {"RLIMIT_STACK", RLIMIT_STACK},
};

int rlimit_resource(const char *name)
{
	for (size_t i = 0; name && i < sizeof(rlimits) / sizeof(*rlimits); i++)
		if (!strcmp(rlimits[i].name, name))
			return rlimits[i].resource;
	return -1;
}

const char *rlimit_name(int resource)
{
	for (size_t i = 0; i < sizeof(rlimits) / sizeof(*rlimits); i++)
		if (rlimits[i].resource == resource)
			return rlimits[i].name;
	return NULL;
}

/* Decimal digits (at most RLIMIT_VALUE_MAX) or "unlimited". */
static int value_parse(const char *s, size_t len, uint64_t *out)
{
	uint64_t v = 0;

	if (len == 9 && !strncmp(s, "unlimited", 9)) {
		*out = RLIMIT_UNLIMITED;
		return 0;
	}
	if (!len || len > 19)
		return -EINVAL;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -EINVAL;
		v = v * 10 + (uint64_t)(s[i] - '0');
	}
	if (v > RLIMIT_VALUE_MAX)
		return -EINVAL;
	*out = v;
	return 0;
}

int rlimit_arg_parse(const char *arg, struct rlimit_val *v, char *err, size_t errlen)
{
	const char *eq = strchr(arg, '='), *colon = eq ? strchr(eq + 1, ':') : NULL;
	char name[32] = "RLIMIT_";
	size_t n = eq ? (size_t)(eq - arg) : 0;

	if (!eq || !colon)
		return errmsg(err, errlen, -EINVAL, "--rlimit '%.80s': want NAME=SOFT:HARD", arg);
	if (n > 7 && !strncasecmp(arg, "RLIMIT_", 7)) {
		arg += 7;
		n -= 7;
	}
	if (n >= sizeof(name) - 7)
		n = sizeof(name) - 8; /* too long for any name: the lookup fails */
	for (size_t i = 0; i < n; i++)
		name[7 + i] = (char)(arg[i] >= 'a' && arg[i] <= 'z' ? arg[i] - 'a' + 'A' : arg[i]);
	name[7 + n] = '\0';
	if ((v->resource = rlimit_resource(name)) < 0)
		return errmsg(err, errlen, -EINVAL, "--rlimit: unknown resource '%.*s'",
			      (int)(eq - arg), arg);
	if (value_parse(eq + 1, (size_t)(colon - eq - 1), &v->soft) ||
	    value_parse(colon + 1, strlen(colon + 1), &v->hard))
		return errmsg(err, errlen, -EINVAL,
			      "--rlimit %s: want SOFT:HARD, each a number or unlimited", name);
	if (v->soft > v->hard)
		return errmsg(err, errlen, -EINVAL, "--rlimit %s: soft limit over the hard one",
			      name);
	return 0;
}

int rlimit_arg_format(const struct rlimit_val *v, char *out, size_t cap)
{
	const char *name = rlimit_name(v->resource);
	char soft[24], hard[24];

	if (!name)
		return -EINVAL;
	if (v->soft == RLIMIT_UNLIMITED)
		strcpy(soft, "unlimited");
	else
		snprintf(soft, sizeof(soft), "%llu", (unsigned long long)v->soft);
	if (v->hard == RLIMIT_UNLIMITED)
		strcpy(hard, "unlimited");
	else
		snprintf(hard, sizeof(hard), "%llu", (unsigned long long)v->hard);
	return (size_t)snprintf(out, cap, "%s=%s:%s", name, soft, hard) < cap ? 0 : -ENOSPC;
}
