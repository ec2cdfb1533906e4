/* Two token buckets as one limiter: an operation goes only when both have its tokens. */
#include "common/rate_limiter.h"

int rate_limiter_init(struct rate_limiter *rl, const struct rate_limit *cfg, uint64_t now_ns)
{
	int r = tb_init(&rl->bytes, cfg->bw, cfg->bw_burst, RATE_REFILL_NS, now_ns);
	return r ? r : tb_init(&rl->ops, cfg->iops, cfg->iops_burst, RATE_REFILL_NS, now_ns);
}

bool rate_limiter_unlimited(const struct rate_limiter *rl)
{
	return tb_unlimited(&rl->bytes) && tb_unlimited(&rl->ops);
}

uint64_t rate_limiter_consume(struct rate_limiter *rl, uint64_t bytes, uint64_t now_ns)
{
	if (!tb_consume(&rl->bytes, bytes, now_ns)) {
		uint64_t w = tb_wait_ns(&rl->bytes, bytes, now_ns);
		uint64_t w2 = tb_wait_ns(&rl->ops, 1, now_ns);
		return (w > w2 ? w : w2) ?: 1;
	}
	if (!tb_consume(&rl->ops, 1, now_ns)) {
		tb_refund(&rl->bytes, bytes);
		return tb_wait_ns(&rl->ops, 1, now_ns) ?: 1;
	}
	return 0;
}
