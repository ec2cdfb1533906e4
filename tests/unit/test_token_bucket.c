/*
 * Unit tests for common/token_bucket and common/rate_limiter on a fake clock (plain numbers:
 * no sleeps, no timed assertions): burst, refill, refund, requests larger than the bucket, and
 * the two buckets of a limiter together.
 */
#include "helpers.h"
#include "common/rate_limiter.h"
#include "common/token_bucket.h"

#define S 1000000000ULL /* one second of the fake clock */

static void test_tb_full_then_empty(void **state)
{
	(void)state;
	struct token_bucket b;
	assert_int_equal(tb_init(&b, 1000, 0, S, 5 * S), 0);
	assert_int_equal(tb_available(&b, 5 * S), 1000);
	assert_true(tb_consume(&b, 600, 5 * S));
	assert_false(tb_consume(&b, 401, 5 * S)); /* a refusal takes nothing */
	assert_int_equal(tb_available(&b, 5 * S), 400);
	assert_true(tb_consume(&b, 400, 5 * S));
	assert_false(tb_consume(&b, 1, 5 * S));
	assert_int_equal(tb_wait_ns(&b, 1, 5 * S), S / 1000);
	assert_int_equal(tb_wait_ns(&b, 1000, 5 * S), S);
}

/* Refill is proportional to the time passed, carries fractions, and stops at the size. */
static void test_tb_refill(void **state)
{
	(void)state;
	struct token_bucket b;
	assert_int_equal(tb_init(&b, 3, 0, S, 0), 0);
	assert_true(tb_consume(&b, 3, 0));
	/* 3 tokens a second: one every 333.33 ms; fractions must not be lost between reads. */
	uint64_t t = 0;
	for (int i = 0; i < 250; i++) {
		t += S / 250; /* 4 ms steps: 0.012 tokens each */
		tb_available(&b, t);
	}
	assert_int_equal(tb_available(&b, t), 3);
	assert_true(tb_consume(&b, 3, t));
	assert_int_equal(tb_wait_ns(&b, 1, t), 333333334);
	assert_false(tb_consume(&b, 1, t + 333333333));
	assert_true(tb_consume(&b, 1, t + 333333334));
	/* Long idle: never more than the size. */
	assert_int_equal(tb_available(&b, t + 1000 * S), 3);
	/* A clock that goes back changes nothing. */
	assert_true(tb_consume(&b, 3, t + 1000 * S));
	assert_int_equal(tb_available(&b, t), 0);
}

/* The one-time burst is spent first and does not come back. */
static void test_tb_burst(void **state)
{
	(void)state;
	struct token_bucket b;
	assert_int_equal(tb_init(&b, 100, 500, S, 0), 0);
	assert_int_equal(tb_available(&b, 0), 600);
	assert_true(tb_consume(&b, 550, 0)); /* 500 of burst, then 50 of the bucket */
	assert_int_equal(b.one_time_burst, 0);
	assert_int_equal(tb_available(&b, 0), 50);
	assert_int_equal(tb_available(&b, 10 * S), 100);
	assert_true(tb_consume(&b, 101, 10 * S)); /* larger than the bucket: one token of debt */
	assert_int_equal(b.budget, -1);
}

static void test_tb_refund(void **state)
{
	(void)state;
	struct token_bucket b;
	assert_int_equal(tb_init(&b, 100, 0, S, 0), 0);
	assert_true(tb_consume(&b, 80, 0));
	tb_refund(&b, 30);
	assert_int_equal(tb_available(&b, 0), 50);
	tb_refund(&b, 1000); /* never above the size */
	assert_int_equal(tb_available(&b, 0), 100);
}

/*
 * A request larger than the bucket (Firecracker's OverConsumption): it goes when the bucket is
 * not in debt, empties it, and the next request waits until the excess has been refilled too.
 */
static void test_tb_oversized(void **state)
{
	(void)state;
	struct token_bucket b;
	assert_int_equal(tb_init(&b, 1000, 0, S, 0), 0);
	assert_true(tb_consume(&b, 300, 0));
	assert_int_equal(tb_wait_ns(&b, 3500, 0), 0);
	assert_true(tb_consume(&b, 3500, 0)); /* 700 in the bucket: 2800 of debt */
	assert_int_equal(tb_available(&b, 0), 0);
	assert_false(tb_consume(&b, 1, 0));
	assert_false(tb_consume(&b, 5000, 0)); /* in debt: even an oversized one waits */
	assert_int_equal(tb_wait_ns(&b, 5000, 0), 2800 * (S / 1000));
	assert_int_equal(tb_wait_ns(&b, 1, 0), 2801 * (S / 1000));
	assert_false(tb_consume(&b, 1, 2800 * (S / 1000)));
	assert_true(tb_consume(&b, 5000, 2800 * (S / 1000))); /* debt paid: the next big one goes */
	assert_int_equal(tb_wait_ns(&b, 1000, 2800 * (S / 1000)), 6 * S); /* 5000 debt + 1000 */
	/* Over 10 s of the fake clock, the long-run rate is the bucket's: 1000 a second. */
	struct token_bucket c;
	assert_int_equal(tb_init(&c, 1000, 0, S, 0), 0);
	uint64_t t = 0, got = 0;
	while (t <= 10 * S) {
		if (tb_consume(&c, 4096, t))
			got += 4096;
		else
			t += tb_wait_ns(&c, 4096, t);
	}
	assert_true(got <= 1000 + 10 * 1000 + 4096);
	assert_true(got >= 10 * 1000 - 4096);
}

static void test_tb_unlimited_and_bad(void **state)
{
	(void)state;
	struct token_bucket b;
	assert_int_equal(tb_init(&b, 0, 100, S, 0), 0);
	assert_true(tb_unlimited(&b));
	assert_true(tb_consume(&b, UINT64_MAX, 0));
	assert_int_equal(tb_wait_ns(&b, UINT64_MAX, 0), 0);
	assert_int_equal(tb_init(&b, TB_MAX_TOKENS + 1, 0, S, 0), -EINVAL);
	assert_int_equal(tb_init(&b, 10, 0, 0, 0), -EINVAL);
	/* The largest bucket refills without overflow. */
	assert_int_equal(tb_init(&b, TB_MAX_TOKENS, 0, S, 0), 0);
	assert_true(tb_consume(&b, TB_MAX_TOKENS, 0));
	assert_int_equal(tb_available(&b, S / 2), TB_MAX_TOKENS / 2);
	assert_int_equal(tb_available(&b, 100 * S), TB_MAX_TOKENS);
}

/* Both buckets must allow; a refusal by the ops bucket gives the bytes back. */
static void test_rate_limiter(void **state)
{
	(void)state;
	struct rate_limiter rl;
	struct rate_limit cfg = {.bw = 10000, .iops = 2};
	assert_int_equal(rate_limiter_init(&rl, &cfg, 0), 0);
	assert_false(rate_limiter_unlimited(&rl));
	assert_int_equal(rate_limiter_consume(&rl, 1000, 0), 0);
	assert_int_equal(rate_limiter_consume(&rl, 1000, 0), 0);
	uint64_t w = rate_limiter_consume(&rl, 1000, 0);
	assert_int_equal(w, S / 2); /* one op every 500 ms */
	assert_int_equal(tb_available(&rl.bytes, 0), 8000);
	assert_int_equal(rate_limiter_consume(&rl, 1000, w), 0);
	/* Both refuse: the longer wait (the ops bucket's) */
	assert_int_equal(rate_limiter_consume(&rl, 9500, w), S / 2);
	w += S;
	assert_int_equal(rate_limiter_consume(&rl, 9000, w), 0);
	/* Only the bytes bucket refuses: the bytes' wait, 8000 bytes at 10000/s */
	assert_int_equal(rate_limiter_consume(&rl, 9000, w), 8 * S / 10);
	assert_int_equal(tb_available(&rl.ops, w), 1);
	struct rate_limit none = {0};
	assert_int_equal(rate_limiter_init(&rl, &none, 0), 0);
	assert_true(rate_limiter_unlimited(&rl));
	assert_int_equal(rate_limiter_consume(&rl, UINT64_MAX, 0), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_tb_full_then_empty), cmocka_unit_test(test_tb_refill),
	    cmocka_unit_test(test_tb_burst),	       cmocka_unit_test(test_tb_refund),
	    cmocka_unit_test(test_tb_oversized),       cmocka_unit_test(test_tb_unlimited_and_bad),
	    cmocka_unit_test(test_rate_limiter),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
