/* One-line error messages for parsers and loaders that report through a caller's buffer. */
#ifndef COVE_ERRMSG_H
#define COVE_ERRMSG_H

#include <stddef.h>

/* Formats into err (when err and errlen are non-zero) and returns code, for `return errmsg(...)`.
 * Control characters (a newline quoted from bad input) become '?': the message is one line. */
int errmsg(char *err, size_t errlen, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

#endif
