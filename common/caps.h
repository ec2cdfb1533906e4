/* Dropping capabilities: the jailed VMM's and cove-broker's. */
#ifndef COVE_COMMON_CAPS_H
#define COVE_COMMON_CAPS_H

#include <stddef.h>

/* Empties the bounding set (up to the running kernel's last capability) and the ambient set:
 * no exec can get a capability back. 0 or -errno with one line in err. */
int caps_drop_bounding(char *err, size_t errlen);
/* Empties the permitted, effective and inheritable sets, then sets no_new_privs. 0 or -errno
 * with one line in err. */
int caps_drop_all(char *err, size_t errlen);

#endif
