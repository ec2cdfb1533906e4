/* The sandbox's CA certificate into its own disk (its overlay, never the shared base image),
 * through the guest agent's file operations, so TLS clients in the guest trust the broker's
 * interception (broker/PROTOCOL.md, "Egress"). */
#ifndef COVE_CLI_CA_INSTALL_H
#define COVE_CLI_CA_INSTALL_H

#include <stddef.h>

#define CA_INSTALL_CERT "/usr/local/share/ca-certificates/cove-sandbox.crt"
#define CA_PEM_MAX	(16 * 1024)	   /* the CA certificate file (as broker/mitm_ca.h) */
#define CA_BUNDLE_MAX	(16 * 1024 * 1024) /* the guest's bundle, read back before appending */

/*
 * The bundle with pem appended: old unchanged when it already holds pem (1 is returned, *out
 * NULL), else old, a newline when old does not end in one, and pem (ending in a newline) in a
 * malloc'd buffer (*outlen bytes), returning 0. -EINVAL when pem is not one PEM certificate,
 * -E2BIG past CA_BUNDLE_MAX, -ENOMEM.
 */
int ca_bundle_append(const char *old, size_t oldlen, const char *pem, size_t pemlen, char **out,
		     size_t *outlen);

/*
 * ca_bundle_append after taking every copy of `stale` (the CA certificate installed before: a
 * template's, when a sandbox made from it gets its own) out of old. stale NULL, empty or not one
 * PEM certificate: nothing is taken out. The same results.
 */
int ca_bundle_replace(const char *old, size_t oldlen, const char *stale, size_t stalelen,
		      const char *pem, size_t pemlen, char **out, size_t *outlen);

/*
 * Reads mitm-ca/mitm-ca.crt beneath the sandbox directory dfd (none: returns 0, nothing to
 * do), writes it to CA_INSTALL_CERT (0644) in the guest (an image without that directory:
 * TRUST_CA_FALLBACK, on cove-init's tmpfs), then appends it to every trust bundle of
 * proto/trust_paths.h the guest has (unless already there), keeping each file's mode. uds: the
 * sandbox's vsock socket. A different certificate already at CA_INSTALL_CERT (the template's CA, in
 * a sandbox made from one) is taken out of the bundle. 0 or -errno with one line in err.
 */
int sbx_ca_install(int dfd, const char *uds, char *err, size_t errlen);

#endif
