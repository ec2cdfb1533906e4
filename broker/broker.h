/* cove-broker state and the two message handlers (guest requests, host control). */
#ifndef COVE_BROKER_BROKER_H
#define COVE_BROKER_BROKER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "audit.h"
#include "common/log.h"
#include "policy.h"
#include "request.h"

struct mitm_ca;

struct broker {
	struct policy pol;
	struct audit audit;
	uint64_t epoch;
	uint8_t token[REQ_TOKEN_BYTES];
	bool have_token;  /* false until the first grant (or --initial-token) */
	int64_t start_ns; /* CLOCK_MONOTONIC of start or the last grant (TTL origin) */
	int helper_timeout_ms;
	long fetch_timeout_s;
	/* The per-sandbox CA (--mitm-ca-dir): with it, a CONNECT to a host some credential names
	 * is intercepted (egress_mitm.c). NULL: no interception. */
	struct mitm_ca *mitm_ca;
	/* The grant (epoch, token, start_ns) and the credentials' usage state are read and
	 * changed by the event loop and by egress connection threads: under this lock. A zeroed
	 * struct broker holds a usable one (glibc's PTHREAD_MUTEX_INITIALIZER is all zeros);
	 * main() initializes it explicitly. */
	pthread_mutex_t lock;
	/* A line per denial, and per allowed request at LOG_DEBUG (-v); never the secret. NULL:
	 * silent (tests). */
	struct logger *log;
};

/* The broker's lines say "cove-broker: ..." within common/log's own prefix. */
#define broker_log(b, lvl, fmt, ...) log_msg((b)->log, (lvl), fmt, ##__VA_ARGS__)

int64_t broker_now_ns(void);

/* A request that passed every check: first its credential helper runs (JOB_HELPER), then its
 * upstream transfer (JOB_TRANSFER). */
struct broker_job;
enum job_state { JOB_HELPER = 1, JOB_TRANSFER };
enum { JOB_WAIT = 0, /* JOB_TRANSFER */ JOB_DONE = 3 }; /* broker_job_advance results */

/* First part of a guest message: parse and check, then start the helper. Either produces a
 * reply (malloc'd JSON, *rlen bytes; denials are audited) or a job in JOB_HELPER state.
 * Returns 0 or -ENOMEM. */
int broker_guest_begin(struct broker *b, const uint8_t *msg, size_t len, char **reply, size_t *rlen,
		       struct broker_job **job);
enum job_state broker_job_state(const struct broker_job *job);
/* JOB_HELPER: the helper's stdout to watch for input (-1 once reading is over), and the
 * helper's deadline (CLOCK_MONOTONIC ns). */
int broker_job_helper_fd(const struct broker_job *job);
int64_t broker_job_deadline(const struct broker_job *job);
/* Reads the helper's output; returns 1 once reading is over (stop watching the fd). */
int broker_job_read(struct broker_job *job);
/* Call once reading is over, or at the deadline, with the fd no longer watched: reaps the
 * helper. Returns JOB_WAIT (not exited yet: call again soon), JOB_TRANSFER (run
 * broker_job_easy, then broker_guest_finish), JOB_DONE (*reply set, job freed) or -ENOMEM
 * (job freed). */
int broker_job_advance(struct broker *b, struct broker_job *job, char **reply, size_t *rlen);
/* The guest went away: ends the job in any state (the caller removed its fd / easy handle),
 * audits it, frees it. */
void broker_job_abort(struct broker *b, struct broker_job *job);
/* Last part: collects the transfer (curl_result is its CURLcode), scrubs, audits, replies,
 * frees the job. */
int broker_guest_finish(struct broker *b, struct broker_job *job, int curl_result, char **reply,
			size_t *rlen);
void *broker_job_easy(struct broker_job *job);	 /* the CURL * to run */
void **broker_job_owner(struct broker_job *job); /* a slot for the caller (its connection) */

/* Both halves with a blocking transfer (used by tests). */
int broker_handle_guest(struct broker *b, const uint8_t *msg, size_t len, char **reply,
			size_t *rlen);

/* Audits and answers a frame the loop could not even read (e.g. over the size cap). */
int broker_reject_frame(struct broker *b, const char *why, char **reply, size_t *rlen);

/* Handles one control message: {"op":"grant"} or {"op":"status"}. */
int broker_handle_ctl(struct broker *b, const uint8_t *msg, size_t len, char **reply, size_t *rlen);

#endif
