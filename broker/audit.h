/* The hash-chained, HMAC-keyed JSON-lines audit log: appending decisions and verifying a log. */
#ifndef COVE_BROKER_AUDIT_H
#define COVE_BROKER_AUDIT_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define AUDIT_LINE_MAX (64 * 1024)
#define AUDIT_URL_MAX  2048
#define AUDIT_KEY_LEN  32

struct audit {
	int fd;
	uint64_t seq;  /* seq of the last record written */
	char prev[65]; /* sha256 hex of the last line (64 zeros for an empty log) */
	bool keyed;    /* lines carry "mac": HMAC-SHA256 under key */
	uint8_t key[AUDIT_KEY_LEN];
	/* Appends come from the event loop and from egress connection threads. */
	pthread_mutex_t lock;
	bool lock_ready;
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

/* Opens (creating, mode 0600) path for appending and continues the chain from its last line.
 * With a key (AUDIT_KEY_LEN bytes, or NULL for none) every new line carries a MAC, and a log
 * whose last line has no MAC or a MAC under another key is refused. */
int audit_open(struct audit *a, const char *path, const uint8_t *key, char *err, size_t errlen);
/* Closes the log and wipes the key. */
void audit_close(struct audit *a);

/* Formats one record line (without the newline) continuing the chain (seq, prev), with a
 * trailing "mac" when key is not NULL. Returns a malloc'd string or NULL. Pure: used by
 * audit_append and the tests. */
char *audit_format(const struct audit_rec *r, uint64_t seq, const char *prev, const char *ts,
		   const uint8_t *key);

/* Appends and fsyncs one record. Returns 0 or -errno. */
int audit_append(struct audit *a, const struct audit_rec *r);

/* Appends and fsyncs one record of another kind: "ts" and "seq", then fields' members in their
 * order, then "prev", "hash" and "mac", chained like every other line. fields must not name
 * any of those keys. Thread-safe (as is audit_append). Returns 0 or -errno. */
int audit_append_fields(struct audit *a, json_t *fields);

/* Verifies a whole log held in memory. Returns 0 when every line chains (and, with a key, every
 * line carries a MAC under it), else the 1-based number of the first bad line, with a reason in
 * why. *nrec gets the number of good records. Without a key a rewritten log whose hashes were
 * recomputed passes: only the key makes the log tamper-evident. */
size_t audit_verify_buf(const char *buf, size_t len, const uint8_t *key, size_t *nrec, char *why,
			size_t whylen);

/* Reads path and runs audit_verify_buf. Returns 0, the bad line number, or -errno. */
long audit_verify_file(const char *path, const uint8_t *key, size_t *nrec, char *why,
		       size_t whylen);

/* The audit MAC key file: 64 hex digits and a newline, a regular file of ours, mode 0600 (not
 * group/other accessible), opened without following links. With create, a missing file is
 * created (O_EXCL, 0600) with a fresh random key. Returns 0 or -errno with a line in err. */
int audit_key_load(const char *path, bool create, uint8_t key[AUDIT_KEY_LEN], char *err,
		   size_t errlen);

#endif
