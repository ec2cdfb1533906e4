/* common/hex: digits of either case, exact-length decode, lower-case encode. */
#include "helpers.h"

#include "common/hex.h"

static void test_hex_digit(void **state)
{
	(void)state;
	assert_int_equal(hex_digit('0'), 0);
	assert_int_equal(hex_digit('9'), 9);
	assert_int_equal(hex_digit('a'), 10);
	assert_int_equal(hex_digit('F'), 15);
	assert_int_equal(hex_digit('g'), -1);
	assert_int_equal(hex_digit('/'), -1);
	assert_int_equal(hex_digit('\0'), -1);
}

static void test_hex_round_trip(void **state)
{
	const uint8_t in[4] = {0x00, 0x7f, 0xa5, 0xff};
	uint8_t out[4];
	char hex[9];

	(void)state;
	hex_encode(in, sizeof(in), hex);
	assert_string_equal(hex, "007fa5ff");
	assert_int_equal(hex_decode("007FA5ff", out, sizeof(out)), 0);
	assert_memory_equal(out, in, sizeof(in));
	assert_int_equal(hex_decode("007fa5f", out, sizeof(out)), -EINVAL);
	assert_int_equal(hex_decode("007fa5ff00", out, sizeof(out)), -EINVAL);
	assert_int_equal(hex_decode("007fa5fg", out, sizeof(out)), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_hex_digit),
	    cmocka_unit_test(test_hex_round_trip),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
