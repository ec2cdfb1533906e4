/* libcurl request: no redirects, http/https only, no proxy, pinned addresses, capped body and
 * headers, decoded content (so the scrubber sees plain bytes). */
#include "fetch.h"
#include "dest.h"
#include "common/errmsg.h"
#include "wipe_alloc.h"

#include <curl/curl.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

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
	nb = wipe_realloc(r->body, r->body_len + len + 1);
	if (!nb)
		return 0;
	r->body = nb;
	memcpy(r->body + r->body_len, data, len);
	r->body_len += len;
	r->body[r->body_len] = '\0';
	return len;
}

/* Every socket curl opens goes through here: close-on-exec (helpers are forked meanwhile), and
 * a second check of the exact address connected to, behind the resolve-and-pin check. */
static curl_socket_t open_socket(void *allow_private, curlsocktype purpose, struct curl_sockaddr *a)
{
	if (purpose == CURLSOCKTYPE_IPCXN && !allow_private && dest_addr_is_private(&a->addr))
		return CURL_SOCKET_BAD;
	return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

int fetch_start(struct fetch *f, const struct fetch_req *req, char *err, size_t errlen)
{
	struct curl_slist *n;
	CURL *c;
	size_t i;

	memset(f, 0, sizeof(*f));
	c = curl_easy_init();
	if (!c)
		return errmsg(err, errlen, -ENOMEM, "curl_easy_init failed");
	f->easy = c;
	for (i = 0; i < req->nheaders; i++) {
		n = curl_slist_append(f->hdrs, req->headers[i]);
		if (!n)
			goto nomem;
		f->hdrs = n;
	}
	/* No "Expect: 100-continue" round trip; the secret goes last. */
	n = curl_slist_append(f->hdrs, "Expect:");
	if (!n)
		goto nomem;
	f->hdrs = n;
	if (req->inject) {
		n = curl_slist_append(f->hdrs, req->inject);
		if (!n)
			goto nomem;
		f->hdrs = n;
	}
	if (req->pin && req->pin[0]) {
		f->pin = curl_slist_append(NULL, req->pin);
		if (!f->pin)
			goto nomem;
	}
	curl_easy_setopt(c, CURLOPT_URL, req->url);
	curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(c, CURLOPT_PROXY, "");
	curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_TIMEOUT,
			 req->timeout_s > 0 ? req->timeout_s : (long)FETCH_TIMEOUT_S);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
	curl_easy_setopt(c, CURLOPT_ACCEPT_ENCODING, "");
	curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)FETCH_BODY_MAX);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, f->hdrs);
	curl_easy_setopt(c, CURLOPT_ERRORBUFFER, f->cerr);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, &f->resp);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &f->resp);
	curl_easy_setopt(c, CURLOPT_USERAGENT, "cove-broker");
	if (f->pin)
		curl_easy_setopt(c, CURLOPT_RESOLVE, f->pin);
	curl_easy_setopt(c, CURLOPT_OPENSOCKETFUNCTION, open_socket);
	curl_easy_setopt(c, CURLOPT_OPENSOCKETDATA, req->allow_private ? (void *)1 : NULL);
	if (req->ca_file)
		curl_easy_setopt(c, CURLOPT_CAINFO, req->ca_file);
	if (!strcmp(req->method, "HEAD"))
		curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
	else if (strcmp(req->method, "GET") || req->body)
		curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req->method);
	if (req->body) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
		curl_easy_setopt(c, CURLOPT_COPYPOSTFIELDS, (const char *)req->body);
	}
	return 0;
nomem:
	fetch_end(f, CURLE_OUT_OF_MEMORY, NULL, 0);
	return errmsg(err, errlen, -ENOMEM, "out of memory");
}

int fetch_end(struct fetch *f, CURLcode rc, char *err, size_t errlen)
{
	struct curl_slist *it;
	int ret = 0;

	if (rc != CURLE_OK) {
		if (f->resp.too_large || rc == CURLE_FILESIZE_EXCEEDED)
			ret = errmsg(err, errlen, -EFBIG,
				     "response over %d KiB body or %d KiB headers",
				     FETCH_BODY_MAX / 1024, FETCH_HEADERS_MAX / 1024);
		else if (rc == CURLE_ABORTED_BY_CALLBACK)
			ret = errmsg(err, errlen, -EIO,
				     "aborted (guest went away or broker stopping)");
		else
			ret = errmsg(err, errlen, -EIO, "%s",
				     f->cerr[0] ? f->cerr : curl_easy_strerror(rc));
		fetch_resp_free(&f->resp);
	} else if (f->easy) {
		curl_easy_getinfo(f->easy, CURLINFO_RESPONSE_CODE, &f->resp.status);
	}
	/* curl_slist_append copied the injected header: wipe that copy. */
	for (it = f->hdrs; it; it = it->next)
		OPENSSL_cleanse(it->data, strlen(it->data));
	curl_slist_free_all(f->hdrs);
	curl_slist_free_all(f->pin);
	curl_easy_cleanup(f->easy);
	f->hdrs = f->pin = NULL;
	f->easy = NULL;
	return ret;
}

int fetch_perform(const struct fetch_req *req, struct fetch_resp *resp, char *err, size_t errlen)
{
	struct fetch f;
	int r = fetch_start(&f, req, err, errlen);

	if (r)
		return r;
	r = fetch_end(&f, curl_easy_perform(f.easy), err, errlen);
	*resp = f.resp;
	return r;
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
