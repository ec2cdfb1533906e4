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

/* A request that passed every check and waits for its upstream transfer. */
struct broker_job;

/* First half of a guest message: parse, checks, helper, easy handle. Either produces a reply
 * (malloc'd JSON, *rlen bytes; denials are audited) or a job whose easy handle
 * (broker_job_easy) the caller runs, then passes to broker_guest_finish. Returns 0 or -ENOMEM. */
int broker_guest_begin(struct broker *b, const uint8_t *msg, size_t len, char **reply,
		       size_t *rlen, struct broker_job **job);
/* Second half: collects the transfer (curl_result is its CURLcode), scrubs, audits, replies,
 * frees the job. */
int broker_guest_finish(struct broker *b, struct broker_job *job, int curl_result, char **reply,
			size_t *rlen);
void *broker_job_easy(struct broker_job *job); /* the CURL * to run */
void **broker_job_owner(struct broker_job *job); /* a slot for the caller (its connection) */

/* Both halves with a blocking transfer (used by tests). */
int broker_handle_guest(struct broker *b, const uint8_t *msg, size_t len, char **reply,
			size_t *rlen);

/* Audits and answers a frame the loop could not even read (e.g. over the size cap). */
int broker_reject_frame(struct broker *b, const char *why, char **reply, size_t *rlen);

/* Handles one control message: {"op":"grant"} or {"op":"status"}. */
int broker_handle_ctl(struct broker *b, const uint8_t *msg, size_t len, char **reply,
		      size_t *rlen);

#endif
