/* libcurl request: no redirects, http/https only, no proxy, pinned addresses, capped body and
 * headers, decoded content (so the scrubber sees plain bytes). */
#include "fetch.h"
#include "errmsg.h"

#include <curl/curl.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int starts_ci(const char *line, size_t len, const char *name)
{
	size_t n = strlen(name);

	return len > n && !strncasecmp(line, name, n) && line[n] == ':';
}

int fetch_header_dropped(const char *line, size_t len)
{
	return starts_ci(line, len, "Set-Cookie") || starts_ci(line, len, "Set-Cookie2") ||
	       starts_ci(line, len, "Content-Length") || starts_ci(line, len, "Content-Encoding") ||
	       starts_ci(line, len, "Transfer-Encoding") || starts_ci(line, len, "Connection");
}

static void free_headers(struct fetch_resp *r)
{
	size_t i;

	for (i = 0; i < r->nheaders; i++)
		free(r->headers[i]);
	free(r->headers);
	r->headers = NULL;
	r->nheaders = 0;
	r->headers_bytes = 0;
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *arg)
{
	struct fetch_resp *r = arg;
	size_t len = size * nmemb, l = len;
	char **nh;

	while (l && (data[l - 1] == '\n' || data[l - 1] == '\r'))
		l--;
	if (l >= 5 && !memcmp(data, "HTTP/", 5)) {
		free_headers(r); /* a new response (after 1xx): keep only the final one */
		return len;
	}
	if (l == 0 || fetch_header_dropped(data, l))
		return len;
	if (r->headers_bytes + l > FETCH_HEADERS_MAX || r->nheaders >= 512) {
		r->too_large = 1;
		return 0;
	}
	nh = realloc(r->headers, (r->nheaders + 1) * sizeof(*nh));
	if (!nh)
		return 0;
	r->headers = nh;
	r->headers[r->nheaders] = strndup(data, l);
	if (!r->headers[r->nheaders])
		return 0;
	r->nheaders++;
	r->headers_bytes += l;
	return len;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
	struct fetch_resp *r = arg;
	size_t len = size * nmemb;
	char *nb;

	if (r->body_len + len > FETCH_BODY_MAX) {
		r->too_large = 1;
		return 0;
	}
	nb = realloc(r->body, r->body_len + len + 1);
	if (!nb)
		return 0;
	r->body = nb;
	memcpy(r->body + r->body_len, data, len);
	r->body_len += len;
	r->body[r->body_len] = '\0';
	return len;
}

int fetch_perform(const struct fetch_req *req, struct fetch_resp *resp, char *err, size_t errlen)
{
	struct curl_slist *hdrs = NULL, *pin = NULL, *n, *it;
	char cerr[CURL_ERROR_SIZE] = "";
	CURL *c;
	CURLcode rc = CURLE_OK;
	size_t i;
	int ret = -EIO;

	memset(resp, 0, sizeof(*resp));
	c = curl_easy_init();
	if (!c)
		return errmsg(err, errlen, -ENOMEM, "curl_easy_init failed");
	for (i = 0; i < req->nheaders; i++) {
		n = curl_slist_append(hdrs, req->headers[i]);
		if (!n)
			goto nomem;
		hdrs = n;
	}
	/* No "Expect: 100-continue" round trip; the secret goes last. */
	n = curl_slist_append(hdrs, "Expect:");
	if (!n)
		goto nomem;
	hdrs = n;
	if (req->inject) {
		n = curl_slist_append(hdrs, req->inject);
		if (!n)
			goto nomem;
		hdrs = n;
	}
	if (req->pin && req->pin[0]) {
		pin = curl_slist_append(NULL, req->pin);
		if (!pin)
			goto nomem;
	}
	curl_easy_setopt(c, CURLOPT_URL, req->url);
	curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(c, CURLOPT_PROXY, "");
	curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, req->timeout_s > 0 ? req->timeout_s :
						  (long)FETCH_TIMEOUT_S);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
	curl_easy_setopt(c, CURLOPT_ACCEPT_ENCODING, "");
	curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)FETCH_BODY_MAX);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(c, CURLOPT_ERRORBUFFER, cerr);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, resp);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, resp);
	curl_easy_setopt(c, CURLOPT_USERAGENT, "cove-broker");
	if (pin)
		curl_easy_setopt(c, CURLOPT_RESOLVE, pin);
	if (!strcmp(req->method, "HEAD"))
		curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
	else if (strcmp(req->method, "GET") || req->body)
		curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req->method);
	if (req->body) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, (const char *)req->body);
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
	}
	rc = curl_easy_perform(c);
	if (rc != CURLE_OK) {
		if (resp->too_large || rc == CURLE_FILESIZE_EXCEEDED)
			errmsg(err, errlen, -EFBIG, "response over %d KiB body or %d KiB headers",
			       FETCH_BODY_MAX / 1024, FETCH_HEADERS_MAX / 1024);
		else
			errmsg(err, errlen, -EIO, "%s", cerr[0] ? cerr : curl_easy_strerror(rc));
		ret = resp->too_large || rc == CURLE_FILESIZE_EXCEEDED ? -EFBIG : -EIO;
		fetch_resp_free(resp);
		goto out;
	}
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &resp->status);
	ret = 0;
	goto out;
nomem:
	ret = errmsg(err, errlen, -ENOMEM, "out of memory");
out:
	/* curl_slist_append copied the injected header: wipe our copy of it. */
	for (it = hdrs; it; it = it->next)
		OPENSSL_cleanse(it->data, strlen(it->data));
	curl_slist_free_all(hdrs);
	curl_slist_free_all(pin);
	curl_easy_cleanup(c);
	return ret;
}

void fetch_resp_free(struct fetch_resp *resp)
{
	size_t i;

	/* Unscrubbed upstream bytes may echo the secret. */
	for (i = 0; i < resp->nheaders; i++)
		OPENSSL_cleanse(resp->headers[i], strlen(resp->headers[i]));
	free_headers(resp);
	if (resp->body)
		OPENSSL_cleanse(resp->body, resp->body_len);
	free(resp->body);
	resp->body = NULL;
	resp->body_len = 0;
}
