/* e2e helper: a guest that has broken into its jailed VMM, played from outside, tries the files. */
/*
 * cove-jail-probe PID ACTION DIR [NAME]: joins the jail of VMM process PID as that process is
 * (its mount namespace and root, its uid and gid, no capability, no_new_privs, and the project's
 * own event-loop seccomp filter, the one the VMM's main thread and every thread it starts run
 * under), then tries ACTION. Each step prints "STEP: done" or "STEP: refused (ERRNO)"; a step the
 * filter traps ends the process by SIGSYS with the filter's own line. Exit 0: every step was
 * refused; 3: some step succeeded (the jail was left); 2: the probe could not join.
 *
 * ACTION:
 *   write DIR NAME          open DIR/NAME for writing by path
 *   write-at DIR NAME       open DIR, then NAME beneath its fd, for writing
 *   rename-over DIR NAME    make a new file in DIR, then rename it over NAME every way there is
 *   unlink-create DIR NAME  unlink DIR/NAME, then create it again
 *   chmod-write DIR NAME    make DIR/NAME mode 0644 (by path and by fd), then open it to write
 *   create DIR NAME         create a new file DIR/NAME
 *   link DIR NAME           link DIR/NAME to a new name, then open the new name to write
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/caps.h"
#include "sandbox/seccomp_filters.h"

struct probe {
	int dfd;
	const char *dir, *name;
	bool escaped;
};

static void step(struct probe *p, const char *what, int r)
{
	if (r >= 0) {
		printf("%s: done\n", what);
		p->escaped = true;
	} else {
		printf("%s: refused (%s)\n", what, strerror(errno));
	}
	fflush(stdout);
}

/* The VMM's uid and gid, from its status file (read before joining). */
static int ids_of(int pid, uid_t *uid, gid_t *gid)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	FILE *f = fopen(path, "r");
	int got = 0;
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		unsigned v;
		if (sscanf(line, "Uid:\t%u", &v) == 1)
			*uid = v, got |= 1;
		else if (sscanf(line, "Gid:\t%u", &v) == 1)
			*gid = v, got |= 2;
	}
	fclose(f);
	return got == 3 ? 0 : -EINVAL;
}

static int join(int pid)
{
	char path[64], why[128];
	uid_t uid = 0;
	gid_t gid = 0;
	if (ids_of(pid, &uid, &gid))
		return -1;
	snprintf(path, sizeof(path), "/proc/%d/root", pid);
	int root = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	snprintf(path, sizeof(path), "/proc/%d/ns/mnt", pid);
	int mnt = open(path, O_RDONLY | O_CLOEXEC);
	if (root < 0 || mnt < 0 || setns(mnt, CLONE_NEWNS) || fchdir(root) || chroot(".") ||
	    chdir("/")) {
		perror("cove-jail-probe: joining the jail's mounts");
		return -1;
	}
	close(root);
	close(mnt);
	if ((setgroups(1, &gid) && errno != EPERM) || setresgid(gid, gid, gid) ||
	    setresuid(uid, uid, uid) || caps_drop_bounding(why, sizeof(why)) ||
	    caps_drop_all(why, sizeof(why)) || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) {
		perror("cove-jail-probe: becoming the VMM's user without capabilities");
		return -1;
	}
	char err[256];
	if (seccomp_trap_init() || seccomp_install(SECCOMP_EVLOOP, err, sizeof(err))) {
		fprintf(stderr, "cove-jail-probe: %s\n", err);
		return -1;
	}
	printf("joined: pid %d's mounts and root, uid %u gid %u, no capability, the event-loop "
	       "filter\n",
	       pid, (unsigned)uid, (unsigned)gid);
	fflush(stdout);
	return 0;
}

static void act(struct probe *p, const char *action)
{
	char path[4096], other[300];
	snprintf(path, sizeof(path), "%s/%s", p->dir, p->name);
	snprintf(other, sizeof(other), "probe-%d", (int)getpid());
	if (!strcmp(action, "create")) {
		step(p, "create beneath the directory's fd",
		     openat(p->dfd, p->name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
	} else if (!strcmp(action, "rename-over")) {
		int fd = openat(p->dfd, other, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		printf("a new file of its own %s: %s\n", other, fd >= 0 ? "made" : strerror(errno));
		step(p, "renameat over it", renameat(p->dfd, other, p->dfd, p->name));
		step(p, "renameat2 over it", renameat2(p->dfd, other, p->dfd, p->name, 0));
		step(p, "renameat2 exchange with it",
		     renameat2(p->dfd, other, p->dfd, p->name, RENAME_EXCHANGE));
		snprintf(other, sizeof(other), "%s/probe-%d", p->dir, (int)getpid());
		step(p, "rename by path over it", rename(other, path));
		step(p, "renameat2 no-replace onto it",
		     renameat2(p->dfd, other, p->dfd, p->name, RENAME_NOREPLACE));
	} else if (!strcmp(action, "unlink-create")) {
		step(p, "unlinkat", unlinkat(p->dfd, p->name, 0));
		step(p, "unlink by path", unlink(path));
		step(p, "create it again",
		     openat(p->dfd, p->name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
	} else if (!strcmp(action, "chmod-write")) {
		step(p, "fchmodat 0644", fchmodat(p->dfd, p->name, 0644, 0));
		int fd = openat(p->dfd, p->name, O_RDONLY | O_CLOEXEC);
		step(p, "fchmod 0644 of a read-only fd", fd >= 0 ? fchmod(fd, 0644) : -1);
		step(p, "then open it to write", openat(p->dfd, p->name, O_WRONLY | O_CLOEXEC));
	} else if (!strcmp(action, "link")) {
		/* Allowed (a clone adopts its parent's frozen layers so): not a way out by itself.
		 */
		int l = linkat(p->dfd, p->name, p->dfd, other, 0);
		printf("linkat to a new name: %s\n",
		       l == 0 ? "made (a new name of the same file, as unwritable)"
			      : strerror(errno));
		step(p, "open the new name to write", openat(p->dfd, other, O_RDWR | O_CLOEXEC));
	} else if (!strcmp(action, "write-at")) {
		step(p, "open beneath the directory's fd to write",
		     openat(p->dfd, p->name, O_RDWR | O_CLOEXEC));
	} else if (!strcmp(action, "write")) {
		step(p, "open by path to write", open(path, O_WRONLY | O_APPEND | O_CLOEXEC));
	} else {
		fprintf(stderr, "cove-jail-probe: unknown action %s\n", action);
		exit(2);
	}
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: cove-jail-probe PID ACTION DIR NAME\n");
		return 2;
	}
	struct probe p = {.dfd = -1, .dir = argv[3], .name = argv[4]};
	if (join(atoi(argv[1])))
		return 2;
	p.dfd = open(p.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	printf("open %s: %s\n", p.dir, p.dfd >= 0 ? "a directory fd" : strerror(errno));
	act(&p, argv[2]);
	return p.escaped ? 3 : 0;
}
