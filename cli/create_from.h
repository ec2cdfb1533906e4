/* `cove create NAME --from T`: a sandbox cloned from a template and restored as a new machine. */
#ifndef COVE_CLI_CREATE_FROM_H
#define COVE_CLI_CREATE_FROM_H

#include <jansson.h>

#include "lifecycle/spec.h"

/*
 * Clones template `tpl` (under its start lock, so `cove template rm` waits) into sandbox `name`,
 * gives it opts' lifecycle settings (snapshot_every_ms, idle_stop_ms, archive_after_ms,
 * delete_after_ms) and the policy (policy_len bytes, checked by policy_take; NULL: the
 * template's, if it has one) and starts it: restored, with a fresh identity (and, with a
 * policy, a broker and an egress CA of its own, which replaces the template's in the guest's
 * trust store). Returns the exit status after one line on stderr (or NAME's line on stdout):
 * 0, 65 no such template, 67 it could not be started (it stays, stopped), 1 otherwise.
 * checkpoint (NULL: none): the clone's chain and overlays are replaced by that directory's
 * packed archive (lifecycle/import.h, checked as it unpacks) before it starts, so it resumes
 * the checkpointed machine under the template's host-made spec: cove-oci restore.
 */
int create_from(const char *name, const char *tpl, const struct sbx_spec *opts, const char *policy,
		size_t policy_len, const char *checkpoint);

/*
 * The warm default create: `name` made from the implicit template of s's machine
 * (lifecycle/warm.h), built first when there is none (one build at a time: concurrent creates
 * of one configuration wait for it and then restore), stale implicit templates (whose inputs
 * changed) removed after a build. With an image's record (cove create --image; else NULL) the
 * template keeps the image's files, and so does every sandbox made from it. The status as
 * create_from.
 */
int create_warm(const char *name, const struct sbx_spec *s, const char *policy, size_t policy_len,
		json_t *image, const char *checkpoint);

#endif
