/* One-line error messages for parsers and loaders that report through a caller's buffer. */
#include "common/errmsg.h"

#include <stdarg.h>
#include <stdio.h>

int errmsg(char *err, size_t errlen, int code, const char *fmt, ...)
{
	if (err && errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
		/* One line, whatever the arguments held: a parser's error text can quote its
		 * (untrusted) input, control characters and all (jansson's "near '...'"). */
		for (char *c = err; *c; c++)
			if ((unsigned char)*c < 0x20 || *c == 0x7f)
				*c = '?';
	}
	return code;
}
