/* Implicit templates: the template a plain `cove create` builds once per configuration and then
 * restores from (the warm default create). */
#ifndef COVE_LIFECYCLE_WARM_H
#define COVE_LIFECYCLE_WARM_H

#include <stdbool.h>
#include <stddef.h>

#include "lifecycle/spec.h"

/* An implicit template is named "warm-" and 16 lowercase hex digits of its key; the name is
 * reserved: `cove template create` refuses it. */
#define WARM_PREFIX	"warm-"
#define WARM_HEX	16
#define WARM_NAME_LEN	(sizeof(WARM_PREFIX) - 1 + WARM_HEX)
#define WARM_BUILD_LOCK ".warm.lock" /* in the templates' root: one build at a time */
#define WARM_KEY_MAX	8192

/* 1 when name is an implicit template's name, else 0. */
int warm_name_is(const char *name);

/*
 * Why the configuration in s never uses an implicit template (a fixed string naming the
 * option: --key, --no-jail, or an extra --disk), or NULL when it may.
 */
const char *warm_ineligible(const struct sbx_spec *s);

/*
 * The key text of s's machine: every setting a template fixes (RAM, vCPUs, CPU template, vsock
 * rate, seccomp) and the identity of each input file (path, device, inode, size, mtime in ns)
 * of its kernel, root image or initramfs and the VMM executable `vmm` (cove-init lives in the
 * root image, so a rebuilt image or cove-init gives a new key). Pure but for the stat() calls.
 * 0 with the text in key (NUL-terminated); -errno with one line in err (an input is missing).
 */
int warm_key_text(const struct sbx_spec *s, const char *vmm, char *key, size_t cap, char *err,
		  size_t errlen);

/* name (WARM_NAME_LEN + 1 bytes) := WARM_PREFIX + the first WARM_HEX hex digits of
 * SHA-256(key). 0 or -EIO. */
int warm_name_of(const char *key, char *name, size_t cap);

#endif
