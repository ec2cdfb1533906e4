/* Where guests keep their TLS trust: the host installs the sandbox's CA there (cli/ca_install.c)
 * and cove-init points programs at it (guest/init/ca_env.c). Shared so the two agree. */
#ifndef COVE_PROTO_TRUST_PATHS_H
#define COVE_PROTO_TRUST_PATHS_H

/* The bundles distributions keep, in the order SSL_CERT_FILE takes the first that exists:
 * Debian, Ubuntu and Alpine; Fedora and RHEL; openSUSE; Alpine's and LibreSSL's cert.pem. */
static const char *const trust_bundles[] = {
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
};
#define TRUST_BUNDLES (sizeof(trust_bundles) / sizeof(trust_bundles[0]))

/* The sandbox's CA alone: where update-ca-certificates looks, else on cove-init's tmpfs (an
 * image without that directory, a distroless one), which is also the bundle of last resort. */
#define TRUST_CA_CERT	  "/usr/local/share/ca-certificates/cove-sandbox.crt"
#define TRUST_CA_FALLBACK "/.cove/cove-sandbox.crt"
#endif
