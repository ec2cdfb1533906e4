/* Shared by the unit tests: cmocka and the C headers it needs, plus small fixtures several files
 * use. */
#ifndef COVE_TEST_HELPERS_H
#define COVE_TEST_HELPERS_H

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

/*
 * Creates a temp file of `size` bytes from `tmpl` ("/tmp/cove-...-XXXXXX", overwritten with the
 * name); the caller unlinks it.
 */
static inline void tmp_file(char *tmpl, off_t size)
{
	int fd = mkstemp(tmpl);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, size), 0);
	close(fd);
}

/* Writes a virtio descriptor (addr, len, flags, next) at `p`, the guest's little-endian layout. */
static inline void write_desc(uint8_t *p, uint64_t addr, uint32_t len, uint16_t flags,
			      uint16_t next)
{
	memcpy(p, &addr, 8);
	memcpy(p + 8, &len, 4);
	memcpy(p + 12, &flags, 2);
	memcpy(p + 14, &next, 2);
}

/* xorshift64*: a fixed seed makes every failure reproducible. */
static inline uint64_t rnd(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545F4914F6CDD1DULL;
}

/* A failed parse must say why, on one line, mentioning `needle` if given. */
static inline void assert_one_line_error(const char *err, const char *needle)
{
	assert_true(err[0] != '\0');
	assert_null(strchr(err, '\n'));
	if (needle && !strstr(err, needle))
		fail_msg("error \"%s\" does not mention \"%s\"", err, needle);
}

#endif
