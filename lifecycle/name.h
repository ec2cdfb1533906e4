/* Sandbox names: what `cove create NAME` accepts, so that every path built from one fits. */
#ifndef COVE_LIFECYCLE_NAME_H
#define COVE_LIFECYCLE_NAME_H

#include <stddef.h>

/* [a-z0-9][a-z0-9-]{0,47}: 48 bytes at most, so /run/cove/NAME/vsock.sock_PORT fits sun_path. */
#define SBX_NAME_MAX 48

/* 0, or -EINVAL with one line in err saying what is wrong with the name. */
int sbx_name_check(const char *name, char *err, size_t errlen);

#endif
