/* The hash-chained JSON-lines audit log: appending decisions and verifying a log file. */
#ifndef COVE_BROKER_AUDIT_H
#define COVE_BROKER_AUDIT_H

#include <stddef.h>
#include <stdint.h>

#define AUDIT_LINE_MAX (64 * 1024)
#define AUDIT_URL_MAX  2048

struct audit {
	int fd;
	uint64_t seq;  /* seq of the last record written */
	char prev[65]; /* sha256 hex of the last line (64 zeros for an empty log) */
};

struct audit_rec {
	uint64_t epoch;
	const char *credential;
	const char *method;
	const char *url;
	const char *decision; /* "allow" or "deny" */
	const char *reason;
	int status; /* HTTP status, 0 when no request was made */
};

/* SHA-256 of data as 64 lowercase hex digits and a NUL. */
void audit_sha256_hex(const void *data, size_t len, char out[65]);

/* Opens (creating, mode 0600) path for appending and continues the chain from its last line. */
int audit_open(struct audit *a, const char *path, char *err, size_t errlen);
void audit_close(struct audit *a);

/* Formats one record line (without the newline) continuing the chain (seq, prev).
 * Returns a malloc'd string or NULL. Pure: used by audit_append and the tests. */
char *audit_format(const struct audit_rec *r, uint64_t seq, const char *prev, const char *ts);

/* Appends and fsyncs one record. Returns 0 or -errno. */
int audit_append(struct audit *a, const struct audit_rec *r);

/* Verifies a whole log held in memory. Returns 0 when every line chains, else the 1-based number
 * of the first bad line, with a reason in why. *nrec gets the number of good records. */
size_t audit_verify_buf(const char *buf, size_t len, size_t *nrec, char *why, size_t whylen);

/* Reads path and runs audit_verify_buf. Returns 0, the bad line number, or -errno. */
long audit_verify_file(const char *path, size_t *nrec, char *why, size_t whylen);

#endif
