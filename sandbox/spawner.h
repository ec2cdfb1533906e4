/* The spawner: a small helper process, forked before any seccomp filter, that starts clones. */
#ifndef COVE_SPAWNER_H
#define COVE_SPAWNER_H

#include <stddef.h>

/*
 * The filtered VMM never forks or execs. For PUT /fork it sends the clone's argv and its
 * ready-pipe write end over a SOCK_SEQPACKET socketpair (SCM_RIGHTS) to the spawner, which
 * starts the cove binary both run (opened before any jail, as /proc/self/exe) with them and
 * answers with the pid and a pidfd of the clone (readable once the clone has exited). The
 * spawner runs only `cove restore ...` whose --key, if any, is the one it was started with; it
 * ends when the VMM's end of the socket closes (the VMM stopped or died).
 */
struct spawner {
	int sock; /* the VMM's end; -1: not started */
	int pid;  /* the spawner process; the VMM reaps it in spawner_stop */
};

#define SPAWNER_DISKS_MAX 8

/*
 * The only --disk values a clone may be given, in order (its parent's own disks, as the parent
 * formats them for a clone): a VMM a guest has broken into must not hand a clone a committed
 * layer, or any other file its jail shows, as a read-write disk. The strings are copied.
 */
struct spawner_disks {
	int nr;
	char arg[SPAWNER_DISKS_MAX][4352];
};

#define SPAWNER_MSG_MAX (64 * 1024) /* bytes of argv strings in one request */

/*
 * Forks the spawner. Call with no other thread running and before the filters. key: the only
 * --key value a clone may be given (NULL: none). exe_fd: an fd of the cove binary to start
 * clones from (a jail has no /proc), or -1 for /proc/self/exe; the spawner keeps its own copy.
 * 0 or -errno.
 */
int spawner_start(struct spawner *sp, const char *key, int exe_fd);
/* The same, with the disks a clone may be given (NULL: any --disk is refused). */
int spawner_start_disks(struct spawner *sp, const char *key, const struct spawner_disks *disks,
			int exe_fd);
/*
 * Starts a clone: argv (NULL-terminated, argv[0] "cove", argv[1] "restore") gets fd3 as its
 * fd 3 (its other fds: stdin and stdout /dev/null, stderr ours), a session of its own, the
 * signal mask empty. On success 0 with *pid and *pidfd (close-on-exec); otherwise -errno
 * (-E2BIG: argv too long, -EPERM: the spawner refused it).
 */
int spawner_spawn(struct spawner *sp, const char *const argv[], int fd3, int *pid, int *pidfd);
/* Closes the socket (the spawner exits) and reaps it. Safe on a spawner never started. */
void spawner_stop(struct spawner *sp);

#endif
