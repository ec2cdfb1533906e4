/* Token buckets for I/O rate limits (Firecracker's rate limiter): the clock is passed in. */
#ifndef COVE_TOKEN_BUCKET_H
#define COVE_TOKEN_BUCKET_H

#include <stdbool.h>
#include <stdint.h>

/*
 * `size` tokens, refilled from empty to full in `refill_ns`, plus a `one_time_burst` that is
 * spent first and never comes back. size 0: no limit. A request for more tokens than `size`
 * goes through whenever the bucket is not in debt and leaves it in debt by the excess (as
 * Firecracker's OverConsumption blocks the limiter until that much has been refilled), so the
 * long-run rate holds for any request size.
 */
struct token_bucket {
	uint64_t size;
	uint64_t one_time_burst; /* what is left of it */
	uint64_t refill_ns;
	int64_t budget;	  /* tokens now; negative: debt from an oversized request */
	uint64_t rem;	  /* fraction of a token refilled, in units of 1/refill_ns */
	uint64_t last_ns; /* clock reading of the last refill */
};

/* The most tokens a bucket may hold (and a request may ask for): 2^50. */
#define TB_MAX_TOKENS (1ULL << 50)

/* A full bucket at `now_ns`. 0, or -EINVAL for a size above TB_MAX_TOKENS or a zero refill. */
int tb_init(struct token_bucket *b, uint64_t size, uint64_t one_time_burst, uint64_t refill_ns,
	    uint64_t now_ns);
static inline bool tb_unlimited(const struct token_bucket *b)
{
	return b->size == 0;
}
/* Takes `n` tokens when it can (true); false leaves the bucket as it was. */
bool tb_consume(struct token_bucket *b, uint64_t n, uint64_t now_ns);
/* Gives back `n` tokens taken for work that did not happen (never above size). */
void tb_refund(struct token_bucket *b, uint64_t n);
/* Tokens that may be taken now (burst included; 0 while in debt; UINT64_MAX unlimited). */
uint64_t tb_available(struct token_bucket *b, uint64_t now_ns);
/* Nanoseconds until tb_consume(n) would succeed: 0 when it would now. */
uint64_t tb_wait_ns(struct token_bucket *b, uint64_t n, uint64_t now_ns);

#endif
