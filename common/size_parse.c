/* Sizes as people write them (size_parse.h). */
#include "common/size_parse.h"

#include <errno.h>
#include <stddef.h>

int size_parse(const char *s, uint64_t *out)
{
	uint64_t v = 0;
	size_t i = 0;
	unsigned shift = 0;

	if (!s || s[0] < '0' || s[0] > '9')
		return -EINVAL;
	for (; s[i] >= '0' && s[i] <= '9'; i++) {
		if (v > (INT64_MAX - 9) / 10)
			return -ERANGE;
		v = v * 10 + (uint64_t)(s[i] - '0');
	}
	switch (s[i]) {
	case '\0':
		break;
	case 'k':
	case 'K':
		shift = 10;
		break;
	case 'm':
	case 'M':
		shift = 20;
		break;
	case 'g':
	case 'G':
		shift = 30;
		break;
	case 't':
	case 'T':
		shift = 40;
		break;
	default:
		return -EINVAL;
	}
	if (shift && s[i + 1])
		return -EINVAL;
	if (v > ((uint64_t)INT64_MAX >> shift))
		return -ERANGE;
	*out = v << shift;
	return 0;
}
