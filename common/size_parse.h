/* Sizes as people write them: "512M", "2G", "1048576" (binary units, K M G T). */
#ifndef COVE_COMMON_SIZE_PARSE_H
#define COVE_COMMON_SIZE_PARSE_H

#include <stdint.h>

/*
 * Pure: decimal digits, then at most one of K, M, G, T (either case; powers of 1024) and
 * nothing else (no sign, space, fraction or "B"). 0; -EINVAL for anything else; -ERANGE past
 * 2^63 - 1 bytes.
 */
int size_parse(const char *s, uint64_t *out);

#endif
