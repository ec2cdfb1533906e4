/* cove-broker state and the two message handlers (guest requests, host control). */
#ifndef COVE_BROKER_BROKER_H
#define COVE_BROKER_BROKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "audit.h"
#include "policy.h"
#include "request.h"

struct broker {
	struct policy pol;
	struct audit audit;
	uint64_t epoch;
	uint8_t token[REQ_TOKEN_BYTES];
	bool have_token;	/* false until the first grant (or --initial-token) */
	int64_t start_ns;	/* CLOCK_MONOTONIC of start or the last grant (TTL origin) */
	int helper_timeout_ms;
	long fetch_timeout_s;
	FILE *log;		/* one line per request; never the secret */
	bool verbose;
};

int64_t broker_now_ns(void);

/* Handles one guest message. Always produces a reply (malloc'd JSON, *rlen bytes) unless out of
 * memory (returns -ENOMEM). Every outcome is appended to the audit log. */
int broker_handle_guest(struct broker *b, const uint8_t *msg, size_t len, char **reply,
			size_t *rlen);

/* Audits and answers a frame the loop could not even read (e.g. over the size cap). */
int broker_reject_frame(struct broker *b, const char *why, char **reply, size_t *rlen);

/* Handles one control message: {"op":"grant"} or {"op":"status"}. */
int broker_handle_ctl(struct broker *b, const uint8_t *msg, size_t len, char **reply,
		      size_t *rlen);

#endif
