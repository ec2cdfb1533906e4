/* The jail: namespaces, a root holding only this sandbox's paths, no privileges, rlimits, cgroups.
 */
#ifndef COVE_JAIL_H
#define COVE_JAIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/log.h"

#define JAIL_MAX_PATHS	24
#define JAIL_PATH_MAX	4096
#define JAIL_MAX_KEEP	8
#define JAIL_MAX_HIDE	8
#define JAIL_DEF_NOFILE 4096
#define JAIL_DEF_FSIZE	(1ULL << 40) /* the largest guest RAM; disks past it need --jail-fsize */
#define JAIL_DEF_PIDS	1024

/* --jail DIR --uid N --gid N and the limits; dir NULL: no jail. */
struct jail_opts {
	const char *dir;
	int64_t uid, gid;     /* -1: not given */
	uint64_t mem_max;     /* cgroup memory.max in bytes; 0: not set */
	uint64_t cpu_max_pct; /* cgroup cpu.max as percent of one CPU; 0: not set */
	uint64_t pids_max;    /* cgroup pids.max; 0: JAIL_DEF_PIDS */
	uint64_t fsize_max;   /* RLIMIT_FSIZE; 0: JAIL_DEF_FSIZE */
	uint64_t nofile;      /* RLIMIT_NOFILE; 0: JAIL_DEF_NOFILE */
	bool no_pid_ns;	      /* tests: stay in this pid namespace (no waiter process) */
	/* Set by jail_enter: an fd of the running binary, kept open (there is no /proc in the
	 * jail) so that clones can be started from it; -1 before. */
	int exe_fd;
	/* Set by jail_run_opts/jail_restore_opts with a key provider: the key relay's socket
	 * (snapshot/keyprov_relay.h), the provider being out of the jail's reach; -1 none. */
	int key_relay_fd;
	int keep[4]; /* --jail-keep-fd: inherited fds to keep open */
	int nr_keep;
	const char *hide[JAIL_MAX_HIDE]; /* --jail-hide: shown empty inside */
	int nr_hide;
};

/* How a host path goes into the jail. */
enum {
	JAIL_RO = 1 << 0,     /* read-only inside */
	JAIL_PARENT = 1 << 1, /* bind the parent directory: cove creates or replaces the path */
	JAIL_DEV = 1 << 2,    /* a device node (/dev/kvm): the bind keeps device access */
};

struct jail_bind {
	char host[JAIL_PATH_MAX]; /* canonical (realpath) host path; the same path inside */
	unsigned flags;
	bool is_dir;
};

struct jail {
	struct jail_opts o;
	struct logger *log;
	int nr;
	struct jail_bind b[JAIL_MAX_PATHS];
	/* Rewritten paths handed back by jail_path (their storage). */
	char inside[JAIL_MAX_PATHS][JAIL_PATH_MAX];
	int nr_inside;
	int keep_fds[JAIL_MAX_KEEP]; /* inherited fds kept open past jail_enter */
	int nr_keep;
};

/* 0, or -EINVAL with a line in err when `o` names a jail without --uid and --gid. */
int jail_opts_check(const struct jail_opts *o, char *err, size_t errlen);
/* Sets `j` up for `o` (copied), with /dev/kvm and /dev/null already added. */
int jail_init(struct jail *j, const struct jail_opts *o, struct logger *log, char *err,
	      size_t errlen);
/*
 * Adds host `path` to the jail (flags JAIL_*) and returns in *inside where the sandbox finds
 * it after jail_enter: its canonical absolute path (relative paths and symbolic links
 * resolved on the host now). JAIL_PARENT: `path` itself may be absent. 0 or -errno with err.
 */
int jail_path(struct jail *j, const char *path, unsigned flags, const char **inside, char *err,
	      size_t errlen);
/* Rewrites a path held in a caller's buffer (a --disk path) in place; as jail_path. */
int jail_path_buf(struct jail *j, char *path, size_t len, unsigned flags, char *err, size_t errlen);
/* An inherited fd to keep open (--ready-fd): 0 or -E2BIG. */
int jail_keep_fd(struct jail *j, int fd);
/*
 * Enters the jail (single-threaded callers only): user namespace when not root, mount, pid,
 * ipc, uts, net namespaces; a tmpfs root on DIR holding only the added paths, made the root;
 * cgroup v2 limits where a writable hierarchy exists; inherited fds closed; rlimits; every
 * capability dropped; uid/gid switched; no_new_privs; not dumpable. With a pid namespace the
 * caller continues as its first process while this one waits and exits with its status.
 * 0, or -errno with one line in err (the process must then exit: it may be half-jailed).
 */
int jail_enter(struct jail *j, char *err, size_t errlen);

#endif
