/* Making untrusted text (guest strings, agent errors) safe to print on a terminal. */
#ifndef COVE_TERM_SAFE_H
#define COVE_TERM_SAFE_H

#include <stddef.h>

/* Copies s (NULL reads as "") into out (cap bytes, always NUL-terminated) with every byte that
 * could drive a terminal made visible: C0 controls, ESC and DEL as \xNN, C1 controls (U+0080..
 * U+009F), line/paragraph separators and bidi overrides as \uNNNN, bytes that are not valid
 * UTF-8 as \xNN. Printable ASCII and other valid UTF-8 pass unchanged. Text that does not fit
 * ends in "...". Returns out, for use as a printf argument. */
char *term_safe(const char *s, char *out, size_t cap);

#endif
