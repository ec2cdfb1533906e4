/* A process and its descendants, signalled together: a jailed VMM is the child of the process
 * vmm.lock names (its pid namespace's waiter), so stopping "the VMM" means stopping both. */
#ifndef COVE_LIFECYCLE_PROC_TREE_H
#define COVE_LIFECYCLE_PROC_TREE_H

#include <sys/types.h>

#define PROC_TREE_MAX 64 /* processes signalled at most */

/*
 * Sends sig to pid and to every descendant found through /proc/PID/task/TID/children (read
 * again after each process is signalled, so a child forked meanwhile is seen by the next walk;
 * at most PROC_TREE_MAX). The number signalled, or -errno when pid itself could not be.
 */
int proc_tree_signal(pid_t pid, int sig);

#endif
