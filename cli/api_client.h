/* Client side of the control API: one HTTP request over the sandbox's Unix socket (libcurl). */
#ifndef COVE_API_CLIENT_H
#define COVE_API_CLIENT_H

#include <stddef.h>

/*
 * Sends `method path` with an optional JSON body to the API socket and waits up to
 * timeout_s. On a reply, *status is the HTTP status and *body the malloc'd reply text.
 * 0, or -errno with a one-line message in `err` when no reply came.
 */
int api_call(const char *sock, const char *method, const char *path, const char *body,
	     long timeout_s, long *status, char **reply, char *err, size_t errlen);
/* The "fault_message" of an error reply, or the reply itself. Returns a pointer into a static-free
 * copy. */
void api_fault_text(const char *reply, char *out, size_t cap);

#endif
