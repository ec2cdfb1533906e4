/* A rate limiter: a bytes bucket and an operations bucket, both refilled every second. */
#ifndef COVE_RATE_LIMITER_H
#define COVE_RATE_LIMITER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/token_bucket.h"

#define RATE_REFILL_NS 1000000000ULL

/* As the host configures it (--disk bw=,iops=,burst=,iops-burst=); 0: no limit / no burst. */
struct rate_limit {
	uint64_t bw;	     /* bytes per second: the bytes bucket's size */
	uint64_t bw_burst;   /* one-time extra bytes */
	uint64_t iops;	     /* operations per second: the ops bucket's size */
	uint64_t iops_burst; /* one-time extra operations */
};

struct rate_limiter {
	struct token_bucket bytes, ops;
};

/* Full buckets at `now_ns`. 0 or -EINVAL (a value above TB_MAX_TOKENS). */
int rate_limiter_init(struct rate_limiter *rl, const struct rate_limit *cfg, uint64_t now_ns);
bool rate_limiter_unlimited(const struct rate_limiter *rl);
/*
 * One operation of `bytes`: 0 when it may go (tokens taken from both buckets), else the
 * nanoseconds until it may (nothing taken).
 */
uint64_t rate_limiter_consume(struct rate_limiter *rl, uint64_t bytes, uint64_t now_ns);

#endif
