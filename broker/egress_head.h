/* Parsing the head of one HTTP proxy request from the guest (http-parser): a CONNECT tunnel or
 * an absolute-form plain-HTTP request, rebuilt in origin form for the upstream. Pure: bytes in,
 * struct out. */
#ifndef COVE_BROKER_EGRESS_HEAD_H
#define COVE_BROKER_EGRESS_HEAD_H

#include <http_parser.h>
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

/*
 * The end of one plain-HTTP request on the guest's stream, so the bytes after it are read as
 * the next request head (and checked) rather than passed on as this one's body. A chunked body
 * is written out again in plain chunks (no extensions, no trailers), so the upstream cannot
 * read its end elsewhere than here. Pure: bytes in, bytes out. Not to be copied once set up
 * (the parser points at it).
 */
struct egress_body {
	http_parser p;
	http_parser_settings s;
	bool chunked, done;
	char *out; /* the current feed's output */
	size_t olen, ocap;
	bool overflow;
};

/* Input bytes per egress_body_feed, and the output room that always suffices for them. */
#define EGRESS_BODY_IN	    4096
#define EGRESS_BODY_OUT(in) (6 * (in) + 64)

/* Sets b up with the request's whole head (as egress_head_parse accepted it). b->done when the
 * request has no body. 0 or -EINVAL. */
int egress_body_init(struct egress_body *b, const char *head, size_t headlen);

/* Feeds up to len (at most EGRESS_BODY_IN) guest bytes; writes what goes upstream to out (room
 * EGRESS_BODY_OUT(len)) and its length to *outlen. Returns how many input bytes belong to this
 * request (fewer than len once it ended: b->done; the rest is the next request), or -EINVAL for
 * a malformed body. */
long egress_body_feed(struct egress_body *b, const char *in, size_t len, char *out, size_t outcap,
		      size_t *outlen);

/* The upstream's answer to one request: where it ends (1xx answers come before it), so nothing
 * the upstream sends after it reaches the guest. Not to be copied once set up. */
struct egress_resp {
	http_parser p;
	http_parser_settings s;
	bool head_request; /* a HEAD's answer has no body, whatever its headers say */
	bool final;	   /* the final answer ended */
	bool at_eof;	   /* ... and the upstream's end was what ended it */
	int status;
};

void egress_resp_init(struct egress_resp *r, bool head_request);

/* Feeds upstream bytes (len 0: the upstream ended). Returns how many belong to the answer
 * (relay those; r->final once it ended), or -EINVAL when it is not HTTP/1.x. */
long egress_resp_feed(struct egress_resp *r, const char *in, size_t len);

#endif
