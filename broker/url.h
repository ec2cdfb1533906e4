/* Splitting a guest-supplied URL into the parts the policy checks (libcurl's URL parser). */
#ifndef COVE_BROKER_URL_H
#define COVE_BROKER_URL_H

#include <stddef.h>

#define URL_MAX 8192

struct url_parts {
	char *scheme; /* lower case: "http" or "https" (others are rejected by the policy) */
	char *host;   /* lower case, IPv6 without brackets */
	int port;     /* explicit or the scheme's default */
	char *path;   /* normalized (dot segments removed), starts with '/' */
	char *url;    /* the normalized URL that is actually requested */
	int host_is_ip;
};

/* Parses url. Returns 0, or -EINVAL with a one-line reason in err (userinfo, no host, too long,
 * encoded dot segments...). */
int url_split(const char *url, struct url_parts *out, char *err, size_t errlen);
void url_parts_free(struct url_parts *u);

#endif
