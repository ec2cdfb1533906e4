/* `cove create NAME --from T`: a sandbox cloned from a template and restored as a new machine. */
#ifndef COVE_CLI_CREATE_FROM_H
#define COVE_CLI_CREATE_FROM_H

#include "lifecycle/spec.h"

/*
 * Clones template `tpl` (under its start lock, so `cove template rm` waits) into sandbox `name`,
 * gives it opts' lifecycle settings (snapshot_every_ms, idle_stop_ms, archive_after_ms,
 * delete_after_ms) and starts it: restored, with a fresh identity. Returns the exit status
 * after one line on stderr (or NAME's line on stdout): 0, 65 no such template, 67 it could not
 * be started (it stays, stopped), 1 otherwise.
 */
int create_from(const char *name, const char *tpl, const struct sbx_spec *opts);

#endif
