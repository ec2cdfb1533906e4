/* The jail's cgroup v2 limits (sandbox/jail.c calls it before its namespaces). */
#ifndef COVE_JAIL_CGROUP_H
#define COVE_JAIL_CGROUP_H

#include "common/log.h"
#include "sandbox/jail.h"

/*
 * Moves this process into CGROUP_ROOT/cove/vmm-PID with pids.max (JAIL_DEF_PIDS unless set),
 * and memory.max and cpu.max when `o` asks, first removing the empty vmm-* cgroups that VMMs
 * which exited left behind. Without a writable cgroup v2 hierarchy, or when a limit cannot be
 * set, one log line says the limits were skipped (a warning when any was asked for).
 */
void jail_cgroup_limits(const struct jail_opts *o, struct logger *log);

#endif
