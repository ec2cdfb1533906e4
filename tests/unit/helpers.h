/* Shared by the unit tests: cmocka and the C headers it needs, plus small fixtures several files
 * use. */
#ifndef COVE_TEST_HELPERS_H
#define COVE_TEST_HELPERS_H

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
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

/* Counts of a fixed-seed mutation loop: inputs that parsed, and inputs refused. */
struct mutation_tally {
	int ok, failed;
};

/*
 * Records one parse of a mutant: a refusal must be -EINVAL with a one-line reason. True when it
 * parsed, so the caller checks what it got.
 */
static inline bool mutation_tally_add(struct mutation_tally *m, int r, const char *err)
{
	if (r == 0) {
		m->ok++;
		return true;
	}
	assert_int_equal(r, -EINVAL);
	assert_one_line_error(err, NULL);
	m->failed++;
	return false;
}

/* Prints the tally; a loop whose mutants all parsed, or all failed, tested little. */
static inline void mutation_tally_report(const struct mutation_tally *m, const char *what)
{
	print_message("%s mutations: %d parsed, %d rejected\n", what, m->ok, m->failed);
	assert_true(m->ok > 0 && m->failed > 0);
}

/*
 * A mutant of the `len` bytes of `text` in `t` (len + 1 bytes): 1 to 3 bytes replaced by bytes of
 * `alphabet`, then a quarter of the time cut short. Returns its length; t[length] is NUL.
 */
static inline size_t mutate_text(char *t, const char *text, size_t len, const char *alphabet,
				 size_t alphabet_len, uint64_t *seed)
{
	memcpy(t, text, len);
	int flips = 1 + (int)(rnd(seed) % 3);
	for (int k = 0; k < flips; k++) {
		size_t at = (size_t)(rnd(seed) % len); /* one call per statement: fixed order */
		t[at] = alphabet[rnd(seed) % alphabet_len];
	}
	size_t l = rnd(seed) % 4 ? len : (size_t)(rnd(seed) % len);
	t[l] = '\0';
	return l;
}

#endif
