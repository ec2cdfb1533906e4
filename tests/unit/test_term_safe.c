/* Unit tests for term_safe: guest text printed by cove ps/cp cannot drive the terminal. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/term_safe.h"

static const char *safe(const char *s)
{
	static char out[256];

	return term_safe(s, out, sizeof(out));
}

static void test_controls(void **state)
{
	(void)state;
	assert_string_equal(safe("plain text: ok/1.0 ~"), "plain text: ok/1.0 ~");
	assert_string_equal(safe(NULL), "");
	/* C0 (clear screen, OSC title, bell, CR overwrite), ESC and DEL. */
	assert_string_equal(safe("a\x1b[2Jb"), "a\\x1b[2Jb");
	assert_string_equal(safe("\x1b]0;owned\x07"), "\\x1b]0;owned\\x07");
	assert_string_equal(safe("ok\rFAKE\n\t"), "ok\\x0dFAKE\\x0a\\x09");
	assert_string_equal(safe("x\x7fy"), "x\\x7fy");
	/* C1 controls: raw bytes (invalid UTF-8) and as UTF-8 (CSI U+009B, OSC U+009D). */
	assert_string_equal(safe("\x9b"
				 "2J"),
			    "\\x9b2J");
	assert_string_equal(safe("\xc2\x9b"
				 "2J"),
			    "\\u009b2J");
	assert_string_equal(safe("\xc2\x9d"), "\\u009d");
	/* Bidi overrides and line separators. */
	assert_string_equal(safe("a\xe2\x80\xae"
				 "b"),
			    "a\\u202eb");
	assert_string_equal(safe("\xe2\x80\xa8"), "\\u2028");
	/* Valid UTF-8 passes; overlong, surrogate and truncated forms are escaped. */
	assert_string_equal(safe("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
			    "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
	assert_string_equal(safe("\xc0\x9b"), "\\xc0\\x9b");
	assert_string_equal(safe("\xed\xa0\x80"), "\\xed\\xa0\\x80");
	assert_string_equal(safe("\xe2\x82"), "\\xe2\\x82");
}

static void test_truncation(void **state)
{
	char out[8];

	(void)state;
	assert_string_equal(term_safe("1234567", out, sizeof(out)), "1234567");
	assert_string_equal(term_safe("12345678", out, sizeof(out)), "1234...");
	/* An escape never gets cut in half. */
	assert_string_equal(term_safe("12\x1b\x1b", out, sizeof(out)), "12...");
	assert_string_equal(term_safe("\x1b", out, sizeof(out)), "\\x1b");
	assert_string_equal(term_safe("abc", out, 3), "");
	assert_string_equal(term_safe("ab", out, 3), "ab");
	assert_string_equal(term_safe("abcdef", out, 4), "...");
	term_safe("x", out, 0); /* writes nothing */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_controls),
	    cmocka_unit_test(test_truncation),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
