/* Parsing the head of one HTTP proxy request from the guest (http-parser): a CONNECT tunnel or
 * an absolute-form plain-HTTP request, rebuilt in origin form for the upstream. Pure: bytes in,
 * struct out. */
#ifndef COVE_BROKER_EGRESS_HEAD_H
#define COVE_BROKER_EGRESS_HEAD_H

#include <stdbool.h>
#include <stddef.h>

#define EGRESS_HEAD_MAX	   (16 * 1024) /* request line + headers + blank line */
#define EGRESS_HEADERS_MAX 100	       /* header lines */

struct egress_head {
	char method[17];
	char host[254]; /* lower case, IPv6 without brackets */
	int port;
	bool is_connect;
	/* Plain HTTP: the request head to send upstream (origin form, Host from the URL,
	 * hop-by-hop and proxy headers dropped, "Connection: close"); malloc'd. NULL for
	 * CONNECT. NUL-terminated (not counted in fwd_len). */
	char *fwd;
	size_t fwd_len;
};

/* Length of the head at the start of buf (through the blank line, CRLF or bare LF), 0 when it
 * has not ended yet, or -E2BIG when no head ends within EGRESS_HEAD_MAX bytes. */
long egress_head_end(const char *buf, size_t len);

/* Parses a complete head of len bytes (as measured by egress_head_end). Returns 0 or -EINVAL
 * with a one-line reason in err (the method and host are kept when known, for the audit).
 * Call egress_head_free either way. */
int egress_head_parse(const char *buf, size_t len, struct egress_head *h, char *err, size_t errlen);
void egress_head_free(struct egress_head *h);

#endif
