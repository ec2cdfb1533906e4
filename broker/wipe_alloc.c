/* Wiping allocators: free and realloc cleanse the whole usable size of the old block. */
#include "wipe_alloc.h"

#include <curl/curl.h>
#include <errno.h>
#include <malloc.h>
#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>

void wipe_free(void *p)
{
	if (!p)
		return;
	OPENSSL_cleanse(p, malloc_usable_size(p));
	free(p);
}

void *wipe_realloc(void *p, size_t n)
{
	size_t old;
	void *q;

	if (!p)
		return malloc(n);
	if (!n) {
		wipe_free(p);
		return NULL;
	}
	old = malloc_usable_size(p);
	q = malloc(n);
	if (!q)
		return NULL;
	memcpy(q, p, old < n ? old : n);
	wipe_free(p);
	return q;
}

static char *wipe_strdup(const char *s)
{
	return strdup(s);
}

static void *ossl_malloc(size_t n, const char *file, int line)
{
	(void)file;
	(void)line;
	return malloc(n);
}

static void *ossl_realloc(void *p, size_t n, const char *file, int line)
{
	(void)file;
	(void)line;
	return wipe_realloc(p, n);
}

static void ossl_free(void *p, const char *file, int line)
{
	(void)file;
	(void)line;
	wipe_free(p);
}

int wipe_alloc_install(void)
{
	if (!CRYPTO_set_mem_functions(ossl_malloc, ossl_realloc, ossl_free))
		return -EIO;
	if (curl_global_init_mem(CURL_GLOBAL_DEFAULT, malloc, wipe_free, wipe_realloc, wipe_strdup,
				 calloc))
		return -EIO;
	return 0;
}
