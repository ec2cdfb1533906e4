/* `cove run --jail` and `cove restore --jail`: their host paths into the jail, then enter it. */
#ifndef COVE_JAIL_PATHS_H
#define COVE_JAIL_PATHS_H

#include <stddef.h>

#include "common/log.h"
#include "sandbox/options.h"
#include "sandbox/restore_sandbox.h"

/*
 * With o->jail.dir set: binds every path the options name into the jail, rewrites the
 * options to the paths inside it and enters it (sandbox/jail.h). The rewritten strings live
 * until the process ends. 0 (also without a jail), or -errno with one line in err.
 */
int jail_run_opts(struct run_opts *o, struct logger *log, char *err, size_t errlen);
int jail_restore_opts(struct sandbox_restore_opts *o, struct logger *log, char *err, size_t errlen);

#endif
