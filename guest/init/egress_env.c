/* egress_env.c: the proxy variables every program cove-init starts finds in its environment. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "egress_proxy.h"

/* Loopback never goes through the proxy: a program's own local services stay direct. */
#define EGRESS_NO_PROXY "localhost,127.0.0.1,::1"

/* Both spellings: curl and wget read the lower-case ones (curl ignores HTTP_PROXY, a CGI
 * hazard), pip/requests and git read either. */
static const struct {
	const char *name;
	bool is_proxy; /* http://127.0.0.1:PORT, else the no_proxy list */
} egress_vars[EGRESS_ENV_COUNT] = {
    {"http_proxy", true},  {"https_proxy", true}, {"HTTP_PROXY", true},
    {"HTTPS_PROXY", true}, {"no_proxy", false},	  {"NO_PROXY", false},
};

static int value_format(unsigned i, uint16_t port, char *buf, size_t size)
{
	int n = egress_vars[i].is_proxy ? snprintf(buf, size, "http://127.0.0.1:%u", port)
					: snprintf(buf, size, "%s", EGRESS_NO_PROXY);

	return n < 0 || (size_t)n >= size ? -ENOSPC : 0;
}

int egress_env_entry(unsigned i, uint16_t port, char *buf, size_t size)
{
	char value[64];
	int n, ret;

	if (i >= EGRESS_ENV_COUNT)
		return -ENOENT;
	ret = value_format(i, port, value, sizeof(value));
	if (ret < 0)
		return ret;
	n = snprintf(buf, size, "%s=%s", egress_vars[i].name, value);
	return n < 0 || (size_t)n >= size ? -ENOSPC : 0;
}

int egress_env_setdefault(uint16_t port)
{
	char value[64];

	for (unsigned i = 0; i < EGRESS_ENV_COUNT; i++) {
		int ret = value_format(i, port, value, sizeof(value));

		if (ret < 0)
			return ret;
		if (setenv(egress_vars[i].name, value, 0) < 0)
			return -errno;
	}
	return 0;
}
