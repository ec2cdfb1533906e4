/* Token bucket arithmetic: refill by elapsed time (no drift from rounding), burst, debt. */
#include "common/token_bucket.h"

#include <errno.h>

int tb_init(struct token_bucket *b, uint64_t size, uint64_t one_time_burst, uint64_t refill_ns,
	    uint64_t now_ns)
{
	if (size > TB_MAX_TOKENS || one_time_burst > TB_MAX_TOKENS || (size && !refill_ns))
		return -EINVAL;
	*b = (struct token_bucket){.size = size,
				   .one_time_burst = size ? one_time_burst : 0,
				   .refill_ns = refill_ns,
				   .budget = (int64_t)size,
				   .last_ns = now_ns};
	return 0;
}

/* Adds what the time since the last refill is worth; the fraction is carried in rem. */
static void refill(struct token_bucket *b, uint64_t now_ns)
{
	if (now_ns <= b->last_ns) /* a clock that did not move (or a test's that went back) */
		return;
	uint64_t elapsed = now_ns - b->last_ns;
	b->last_ns = now_ns;
	if (b->budget >= (int64_t)b->size) {
		b->rem = 0;
		return;
	}
	unsigned __int128 acc = (unsigned __int128)elapsed * b->size + b->rem;
	unsigned __int128 add = acc / b->refill_ns;
	uint64_t room = (uint64_t)((int64_t)b->size - b->budget); /* at most 2^51 */
	if (add >= room) {
		b->budget = (int64_t)b->size;
		b->rem = 0;
		return;
	}
	b->budget += (int64_t)add;
	b->rem = (uint64_t)(acc % b->refill_ns);
}

bool tb_consume(struct token_bucket *b, uint64_t n, uint64_t now_ns)
{
	if (tb_unlimited(b))
		return true;
	if (n > TB_MAX_TOKENS)
		n = TB_MAX_TOKENS; /* keeps the debt arithmetic in range; far beyond any request */
	refill(b, now_ns);
	uint64_t from_burst = n < b->one_time_burst ? n : b->one_time_burst;
	uint64_t rest = n - from_burst;
	if (rest > b->size) {
		/* Larger than the bucket: goes unless in debt, and leaves the excess as debt. */
		if (b->budget < 0)
			return false;
	} else if ((int64_t)rest > b->budget) {
		return false;
	}
	b->one_time_burst -= from_burst;
	b->budget -= (int64_t)rest;
	return true;
}

void tb_refund(struct token_bucket *b, uint64_t n)
{
	if (tb_unlimited(b))
		return;
	uint64_t room = (uint64_t)((int64_t)b->size - b->budget);
	b->budget += (int64_t)(n < room ? n : room);
}

uint64_t tb_available(struct token_bucket *b, uint64_t now_ns)
{
	if (tb_unlimited(b))
		return UINT64_MAX;
	refill(b, now_ns);
	return (b->budget > 0 ? (uint64_t)b->budget : 0) + b->one_time_burst;
}

uint64_t tb_wait_ns(struct token_bucket *b, uint64_t n, uint64_t now_ns)
{
	if (tb_unlimited(b))
		return 0;
	if (n > TB_MAX_TOKENS)
		n = TB_MAX_TOKENS;
	refill(b, now_ns);
	uint64_t rest = n > b->one_time_burst ? n - b->one_time_burst : 0;
	/* An oversized request waits only for the debt to be paid; others for their tokens. */
	int64_t want = rest > b->size ? 0 : (int64_t)rest;
	if (b->budget >= want)
		return 0;
	uint64_t need = (uint64_t)(want - b->budget); /* whole tokens missing */
	unsigned __int128 units = (unsigned __int128)need * b->refill_ns - b->rem;
	unsigned __int128 ns = (units + b->size - 1) / b->size;
	return ns > UINT64_MAX ? UINT64_MAX : (uint64_t)ns;
}
