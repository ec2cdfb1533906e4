/*
 * Unit tests for snapshot/ossl_lazy.c: linked like cove-vmm (the shim, not libcrypto), this
 * process maps no libcrypto until the first crypto call, then seals and opens as usual.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "snapshot/crypto.h"

static int libcrypto_mapped(void)
{
	char line[512];
	int found = 0;
	FILE *f = fopen("/proc/self/maps", "re");

	assert_non_null(f);
	while (fgets(line, sizeof(line), f))
		found |= strstr(line, "/libcrypto.so") != NULL;
	fclose(f);
	return found;
}

static void test_loaded_on_first_use(void **state)
{
	struct snap_key *key;
	struct crypto_ctx *cc;
	uint8_t chain[CRYPTO_CHAIN_ID_LEN] = {1, 2, 3};
	static const char msg[] = "guest state";
	uint8_t sealed[sizeof(msg) + CRYPTO_BLOB_OVERHEAD], out[sizeof(msg)];

	(void)state;
	assert_int_equal(libcrypto_mapped(), 0);
	assert_int_equal(crypto_key_generate(&key), 0);
	assert_int_equal(libcrypto_mapped(), 1);
	assert_int_equal(crypto_ctx_new(key, &cc), 0);
	assert_int_equal(crypto_seal_blob(cc, chain, "state", msg, sizeof(msg), sealed), 0);
	assert_int_equal(crypto_open_blob(cc, chain, "state", sealed, sizeof(sealed), out), 0);
	assert_memory_equal(out, msg, sizeof(msg));
	sealed[sizeof(sealed) - 1] ^= 1;
	assert_int_equal(crypto_open_blob(cc, chain, "state", sealed, sizeof(sealed), out),
			 -EBADMSG);
	crypto_ctx_free(cc);
	crypto_key_free(key);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_loaded_on_first_use),
	};
	return cmocka_run_group_tests_name("ossl_lazy", tests, NULL, NULL);
}
