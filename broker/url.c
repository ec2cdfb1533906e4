/* URL parsing for policy checks: libcurl's CURLU so the checked URL is the one curl requests. */
#include "url.h"
#include "common/errmsg.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void lower(char *s)
{
	for (; *s; s++)
		*s = (char)tolower((unsigned char)*s);
}

static char *dup_part(CURLU *h, CURLUPart part, unsigned flags)
{
	char *v = NULL, *d;

	if (curl_url_get(h, part, &v, flags) != CURLUE_OK || !v)
		return NULL;
	d = strdup(v);
	curl_free(v);
	return d;
}

void url_parts_free(struct url_parts *u)
{
	free(u->scheme);
	free(u->host);
	free(u->path);
	free(u->url);
	memset(u, 0, sizeof(*u));
}

int url_split(const char *url, struct url_parts *out, char *err, size_t errlen)
{
	CURLU *h;
	char *v = NULL, *port = NULL;
	unsigned char addr[16];
	size_t i, n = strlen(url);
	int ret = -EINVAL;

	memset(out, 0, sizeof(*out));
	if (n == 0 || n > URL_MAX)
		return errmsg(err, errlen, -EINVAL, "url empty or over %d bytes", URL_MAX);
	for (i = 0; i < n; i++)
		if ((unsigned char)url[i] <= 0x20 || url[i] == 0x7f || url[i] == '\\')
			return errmsg(err, errlen, -EINVAL,
				      "url has a space, control or '\\' byte");
	h = curl_url();
	if (!h)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	if (curl_url_set(h, CURLUPART_URL, url, 0) != CURLUE_OK) {
		errmsg(err, errlen, -EINVAL, "url does not parse");
		goto out;
	}
	if (curl_url_get(h, CURLUPART_USER, &v, 0) == CURLUE_OK ||
	    curl_url_get(h, CURLUPART_PASSWORD, &v, 0) == CURLUE_OK) {
		curl_free(v);
		errmsg(err, errlen, -EINVAL, "url has user info");
		goto out;
	}
	out->scheme = dup_part(h, CURLUPART_SCHEME, 0);
	out->host = dup_part(h, CURLUPART_HOST, 0);
	out->path = dup_part(h, CURLUPART_PATH, 0);
	out->url = dup_part(h, CURLUPART_URL, 0);
	port = dup_part(h, CURLUPART_PORT, CURLU_DEFAULT_PORT);
	if (!out->scheme || !out->host || !out->path || !out->url || !port) {
		errmsg(err, errlen, -EINVAL, "url lacks scheme, host, path or port");
		goto out;
	}
	lower(out->scheme);
	lower(out->host);
	out->port = atoi(port);
	if (out->port <= 0 || out->port > 65535) {
		errmsg(err, errlen, -EINVAL, "url port out of range");
		goto out;
	}
	if (out->host[0] == '[') {
		size_t hl = strlen(out->host);

		if (hl < 3 || out->host[hl - 1] != ']') {
			errmsg(err, errlen, -EINVAL, "url host malformed");
			goto out;
		}
		memmove(out->host, out->host + 1, hl - 2);
		out->host[hl - 2] = '\0';
	}
	if (!out->host[0] || strchr(out->host, '%')) {
		errmsg(err, errlen, -EINVAL, "url host empty or has a zone id/escape");
		goto out;
	}
	out->host_is_ip =
	    inet_pton(AF_INET, out->host, addr) == 1 || inet_pton(AF_INET6, out->host, addr) == 1;
	/* Servers may decode %2e/%2f after our prefix check: refuse them rather than guess. */
	if (strcasestr(out->path, "%2e") || strcasestr(out->path, "%2f") ||
	    strcasestr(out->path, "%5c")) {
		errmsg(err, errlen, -EINVAL, "url path has an encoded '.', '/' or '\\'");
		goto out;
	}
	ret = 0;
out:
	free(port);
	curl_url_cleanup(h);
	if (ret)
		url_parts_free(out);
	return ret;
}
