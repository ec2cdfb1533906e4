/* ca_env.c: the TLS trust variables every program cove-init starts gets by default. */
#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include "egress_proxy.h"
#include "proto/trust_paths.h"

static const char *first_bundle(void)
{
	for (size_t i = 0; i < TRUST_BUNDLES; i++)
		if (access(trust_bundles[i], R_OK) == 0)
			return trust_bundles[i];
	return access(TRUST_CA_FALLBACK, R_OK) == 0 ? TRUST_CA_FALLBACK : NULL;
}

int ca_env_entry(unsigned i, char *buf, size_t size)
{
	static const char *const names[CA_ENV_COUNT] = {"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE",
							"NODE_EXTRA_CA_CERTS"};
	const char *path;
	int n;

	if (i >= CA_ENV_COUNT)
		return -ENOENT;
	if (i < 2)
		path = first_bundle();
	else
		path = access(TRUST_CA_CERT, R_OK) == 0	      ? TRUST_CA_CERT
		       : access(TRUST_CA_FALLBACK, R_OK) == 0 ? TRUST_CA_FALLBACK
							      : NULL;
	if (!path)
		return -ENOENT;
	n = snprintf(buf, size, "%s=%s", names[i], path);
	return n < 0 || (size_t)n >= size ? -ENOSPC : 0;
}
