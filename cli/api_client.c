/*
 * Client side of the control API: one HTTP request over the sandbox's Unix socket (libcurl).
 * libcurl is loaded when a request is made, not when cove starts: it and what it links (about
 * 27 libraries, GnuTLS and Kerberos among them) cost every process ~11 ms to load here and
 * ~60 ms in the KVM box, and most cove processes (a VMM, `cove exec`) never make a request.
 */
#include "cli/api_client.h"

#include <dlfcn.h>
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

/* The libcurl calls this file makes, looked up in the library loaded on demand. */
struct curl_fns {
	void *lib;
	CURL *(*easy_init)(void);
	CURLcode (*easy_setopt)(CURL *, CURLoption, ...);
	CURLcode (*easy_perform)(CURL *);
	CURLcode (*easy_getinfo)(CURL *, CURLINFO, ...);
	void (*easy_cleanup)(CURL *);
	const char *(*easy_strerror)(CURLcode);
	struct curl_slist *(*slist_append)(struct curl_slist *, const char *);
	void (*slist_free_all)(struct curl_slist *);
};

static int curl_load(struct curl_fns *f, char *err, size_t errlen)
{
	/* NODELETE: loaded once per process; later calls find it mapped. */
	f->lib = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	if (!f->lib)
		return errmsg(err, errlen, -ENOENT, "cannot load libcurl for the API client: %s",
			      dlerror());
	*(void **)&f->easy_init = dlsym(f->lib, "curl_easy_init");
	*(void **)&f->easy_setopt = dlsym(f->lib, "curl_easy_setopt");
	*(void **)&f->easy_perform = dlsym(f->lib, "curl_easy_perform");
	*(void **)&f->easy_getinfo = dlsym(f->lib, "curl_easy_getinfo");
	*(void **)&f->easy_cleanup = dlsym(f->lib, "curl_easy_cleanup");
	*(void **)&f->easy_strerror = dlsym(f->lib, "curl_easy_strerror");
	*(void **)&f->slist_append = dlsym(f->lib, "curl_slist_append");
	*(void **)&f->slist_free_all = dlsym(f->lib, "curl_slist_free_all");
	if (!f->easy_init || !f->easy_setopt || !f->easy_perform || !f->easy_getinfo ||
	    !f->easy_cleanup || !f->easy_strerror || !f->slist_append || !f->slist_free_all) {
		dlclose(f->lib);
		return errmsg(err, errlen, -ENOENT, "libcurl.so.4 lacks a function the API client uses");
	}
	return 0;
}

int api_call(const char *sock, const char *method, const char *path, const char *body,
	     long timeout_s, long *status, char **reply, char *err, size_t errlen)
{
	struct curl_fns f = {0};
	*reply = NULL;
	*status = 0;
	int r = curl_load(&f, err, errlen);
	if (r)
		return r;
	CURL *c = f.easy_init();
	if (!c) {
		dlclose(f.lib);
		return errmsg(err, errlen, -ENOMEM, "cannot start an HTTP client");
	}
	char url[512];
	snprintf(url, sizeof(url), "http://localhost%s", path);
	struct sink s = {0};
	struct curl_slist *hdr = f.slist_append(NULL, "Content-Type: application/json");
	f.easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, sock);
	f.easy_setopt(c, CURLOPT_URL, url);
	f.easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	f.easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
	f.easy_setopt(c, CURLOPT_TIMEOUT, timeout_s);
	f.easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	f.easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
	f.easy_setopt(c, CURLOPT_WRITEDATA, &s);
	if (body)
		f.easy_setopt(c, CURLOPT_POSTFIELDS, body);
	CURLcode rc = f.easy_perform(c);
	if (rc != CURLE_OK) {
		r = errmsg(err, errlen, rc == CURLE_OPERATION_TIMEDOUT ? -ETIMEDOUT : -ECONNREFUSED,
			   "%s %s on %s: %s", method, path, sock,
			   s.too_big ? "reply too large" : f.easy_strerror(rc));
		free(s.p);
	} else {
		f.easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
		*reply = s.p ? s.p : strdup("");
	}
	f.slist_free_all(hdr);
	f.easy_cleanup(c);
	dlclose(f.lib);
	return r;
}

void api_fault_text(const char *reply, char *out, size_t cap)
{
	json_t *j = json_loads(reply ? reply : "", 0, NULL);
	const char *m = json_string_value(json_object_get(j, "fault_message"));
	snprintf(out, cap, "%s", m ? m : reply ? reply : "");
	json_decref(j);
}
