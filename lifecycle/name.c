/* Sandbox name validation. */
#include "lifecycle/name.h"

#include <errno.h>
#include <string.h>

#include "common/errmsg.h"

static int name_char(char c, int first)
{
	return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (!first && c == '-');
}

int sbx_name_check(const char *name, char *err, size_t errlen)
{
	size_t n = name ? strnlen(name, SBX_NAME_MAX + 1) : 0;

	if (n == 0)
		return errmsg(err, errlen, -EINVAL, "a sandbox name is required");
	if (n > SBX_NAME_MAX)
		return errmsg(err, errlen, -EINVAL,
			      "sandbox name too long (at most %d characters: [a-z0-9][a-z0-9-]*)",
			      SBX_NAME_MAX);
	for (size_t i = 0; i < n; i++)
		if (!name_char(name[i], i == 0))
			return errmsg(err, errlen, -EINVAL,
				      "bad sandbox name: character %zu is not allowed (names are "
				      "[a-z0-9][a-z0-9-]*, at most %d characters)",
				      i + 1, SBX_NAME_MAX);
	return 0;
}
