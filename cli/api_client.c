/* Client side of the control API: one HTTP request over the sandbox's Unix socket (libcurl). */
#include "cli/api_client.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <jansson.h>

#include "common/errmsg.h"

#define REPLY_MAX (1u << 20)

struct sink {
	char *p;
	size_t len;
	bool too_big;
};

static size_t on_data(char *data, size_t size, size_t n, void *opaque)
{
	struct sink *s = opaque;
	size_t k = size * n;
	if (s->len + k > REPLY_MAX) {
		s->too_big = true;
		return 0;
	}
	char *p = realloc(s->p, s->len + k + 1);
	if (!p)
		return 0;
	memcpy(p + s->len, data, k);
	s->p = p;
	s->len += k;
	p[s->len] = 0;
	return k;
}

int api_call(const char *sock, const char *method, const char *path, const char *body,
	     long timeout_s, long *status, char **reply, char *err, size_t errlen)
{
	*reply = NULL;
	*status = 0;
	CURL *c = curl_easy_init();
	if (!c)
		return errmsg(err, errlen, -ENOMEM, "cannot start an HTTP client");
	char url[512];
	snprintf(url, sizeof(url), "http://localhost%s", path);
	struct sink s = {0};
	struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
	curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, sock);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, timeout_s);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
	if (body)
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
	CURLcode rc = curl_easy_perform(c);
	int r = 0;
	if (rc != CURLE_OK) {
		r = errmsg(err, errlen, rc == CURLE_OPERATION_TIMEDOUT ? -ETIMEDOUT : -ECONNREFUSED,
			   "%s %s on %s: %s", method, path, sock,
			   s.too_big ? "reply too large" : curl_easy_strerror(rc));
		free(s.p);
	} else {
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
		*reply = s.p ? s.p : strdup("");
	}
	curl_slist_free_all(hdr);
	curl_easy_cleanup(c);
	return r;
}

void api_fault_text(const char *reply, char *out, size_t cap)
{
	json_t *j = json_loads(reply ? reply : "", 0, NULL);
	const char *m = json_string_value(json_object_get(j, "fault_message"));
	snprintf(out, cap, "%s", m ? m : reply ? reply : "");
	json_decref(j);
}
