/* Allocators that wipe memory before it returns to the heap, for libcurl and OpenSSL, so
 * request headers (the secret) and unscrubbed responses do not linger in freed memory. */
#ifndef COVE_BROKER_WIPE_ALLOC_H
#define COVE_BROKER_WIPE_ALLOC_H

#include <stddef.h>

void wipe_free(void *p);
void *wipe_realloc(void *p, size_t n); /* never leaves the old block unwiped */

/* Installs the wiping allocators into OpenSSL (must run before OpenSSL allocates anything)
 * and initializes libcurl with them (instead of curl_global_init). Returns 0 or -EIO. */
int wipe_alloc_install(void);

#endif
