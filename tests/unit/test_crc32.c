/*
 * Unit tests for common/crc32: zlib's CRC-32 gives the exact values cove's formats were written
 * with (the bitwise loop overlay maps and key files used before), so old files still verify.
 */
#include "helpers.h"
#include "common/crc32.h"

/* The bitwise loop every overlay map, key file and layer-seq file was written with. */
static uint32_t crc32_bitwise(uint32_t crc, const void *buf, size_t len)
{
	const uint8_t *p = buf;
	crc = ~crc;
	while (len--) {
		crc ^= *p++;
		for (int k = 0; k < 8; k++)
			crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1)));
	}
	return ~crc;
}

static void test_crc32_vectors(void **state)
{
	(void)state;
	assert_int_equal(crc32_update(0, "123456789", 9), 0xcbf43926u);
	assert_int_equal(crc32_update(0, "", 0), 0);
	assert_int_equal(crc32_update(0, "a", 1), 0xe8b7be43u);
	assert_int_equal(crc32_update(0, "The quick brown fox jumps over the lazy dog", 43),
			 0x414fa339u);
	uint8_t zeros[32] = {0};
	assert_int_equal(crc32_update(0, zeros, sizeof(zeros)), 0x190a55adu);
	/* continuing over pieces gives the whole buffer's value */
	assert_int_equal(crc32_update(crc32_update(0, "12345", 5), "6789", 4), 0xcbf43926u);
}

static void test_crc32_matches_bitwise(void **state)
{
	(void)state;
	static uint8_t buf[70000];
	uint64_t seed = 0x5eed;
	for (size_t i = 0; i < sizeof(buf); i++) {
		seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
		buf[i] = (uint8_t)(seed >> 56);
	}
	for (size_t len = 0; len < sizeof(buf); len = len * 3 + 1)
		assert_int_equal(crc32_update(0, buf, len), crc32_bitwise(0, buf, len));
	assert_int_equal(crc32_update(0x12345678u, buf, 1000),
			 crc32_bitwise(0x12345678u, buf, 1000));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_crc32_vectors),
	    cmocka_unit_test(test_crc32_matches_bitwise),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
