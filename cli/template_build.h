/* Building a template: boot once, run the setup command, wait for quiet, save it stopped. Used by
 * `cove template create` and by the warm default `cove create` (its implicit templates). */
#ifndef COVE_CLI_TEMPLATE_BUILD_H
#define COVE_CLI_TEMPLATE_BUILD_H

#include <stddef.h>

#include <jansson.h>

#include "lifecycle/root.h"
#include "lifecycle/spec.h"
#include "lifecycle/template.h"

/*
 * Builds template `name` beneath the templates' root t (r: the sandboxes' root) from the
 * machine in s (snapshots off but the last; a new machine id): boots it, runs `run` (NULL none)
 * with sh -c as root in the guest (its output on ours), syncs, waits until the guest is quiet,
 * stops it and writes its template.json last. With a policy (policy != NULL) the template keeps
 * it and boots with a broker, so its guest trusts the template's own CA until a sandbox made
 * from it replaces it. With an image's record (image != NULL: cove create --image's spec in s),
 * the image's ext4 is hard-linked into the template and disk 0 names the link, so removing the
 * image never breaks the template. m is filled in. Progress and errors go to stderr after `who`.
 * 0; SBX_EXIT_EXISTS (68) when it exists; 1 otherwise (nothing of it is left).
 */
int tpl_build(const struct sbx_root *r, const struct sbx_root *t, const char *name,
	      struct sbx_spec *s, const char *run, const char *policy, size_t policy_len,
	      json_t *image, const char *who, struct tpl_meta *m);

/* RUN/.t/NAME, the sockets of a template's build, removed. */
void tpl_run_dir_remove(const struct sbx_root *t, const char *name);

#endif
