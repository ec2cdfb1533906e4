/* The lease object (lifecycle/store/lease.c): encode, and decode of hostile input. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "lifecycle/store/lease.h"

static const uint8_t KEY[32] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
				17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

static char *sample(void)
{
	struct store_lease l = {.epoch = 3, .generation = 9, .expires_ms = 1700000000000};
	strcpy(l.sandbox, "agent-1");
	strcpy(l.host, "host-a");
	return store_lease_encode(&l, KEY, sizeof(KEY));
}

static void test_roundtrip(void **state)
{
	(void)state;
	char *t = sample(), err[256];
	struct store_lease l;
	assert_non_null(t);
	assert_int_equal(store_lease_decode(t, strlen(t), KEY, sizeof(KEY), &l, err, sizeof(err)),
			 0);
	assert_string_equal(l.sandbox, "agent-1");
	assert_string_equal(l.host, "host-a");
	assert_int_equal(l.epoch, 3);
	assert_int_equal(l.generation, 9);
	assert_int_equal(l.expires_ms, 1700000000000);
	free(t);
}

/* Replaces the first `from` in t by `to` (same buffer, room for growth). */
static char *edit(const char *t, const char *from, const char *to)
{
	const char *p = strstr(t, from);
	assert_non_null(p);
	char *out = malloc(strlen(t) + strlen(to) + 1);
	sprintf(out, "%.*s%s%s", (int)(p - t), t, to, p + strlen(from));
	return out;
}

static void refused(const char *t, const char *want)
{
	struct store_lease l;
	char err[256] = "";
	assert_int_equal(store_lease_decode(t, strlen(t), KEY, sizeof(KEY), &l, err, sizeof(err)),
			 -EBADMSG);
	if (!strstr(err, want))
		fail_msg("error \"%s\" does not say \"%s\"", err, want);
}

static void test_refused(void **state)
{
	(void)state;
	char *t = sample();
	char *e = edit(t, "\"host-a\"", "\"host-b\"");
	refused(e, "bad MAC"); /* any change without the key */
	free(e);
	uint8_t other[32] = {0};
	struct store_lease l;
	char err[256];
	assert_int_equal(store_lease_decode(t, strlen(t), other, sizeof(other), &l, err,
					    sizeof(err)),
			 -EBADMSG);
	refused("[1,2]", "not a JSON object");
	refused("{\"format\":\"cove-lease-1\"}", "no MAC");
	free(t);
	/* Well MAC'ed but wrong inside: a host id that is a path, a sandbox that is not a name,
	 * epoch 0. */
	struct store_lease bad = {.epoch = 1, .expires_ms = 5};
	strcpy(bad.sandbox, "agent-1");
	strcpy(bad.host, "../etc");
	t = store_lease_encode(&bad, KEY, sizeof(KEY));
	refused(t, "not a host id");
	free(t);
	strcpy(bad.host, "h");
	strcpy(bad.sandbox, "A/B");
	t = store_lease_encode(&bad, KEY, sizeof(KEY));
	refused(t, "not a sandbox name");
	free(t);
	strcpy(bad.sandbox, "agent-1");
	bad.epoch = 0;
	t = store_lease_encode(&bad, KEY, sizeof(KEY));
	refused(t, "epoch");
	free(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_roundtrip),
	    cmocka_unit_test(test_refused),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
