/* mounts.c: mounts the pseudo and scratch filesystems a sandbox expects. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cove-init.h"

struct mount_spec {
	const char *source;
	const char *target;
	const char *fstype;
	unsigned long flags;
	const char *data;
	int optional; /* the kernel may lack it: say nothing when it does (ENODEV) */
};

/* In order: later targets live inside earlier ones. */
static const struct mount_spec mount_table[] = {
    {"proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL, 0},
    {"sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL, 0},
    {"devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755", 0},
    {"devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "gid=5,mode=0620,ptmxmode=0666", 1},
    {"tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777", 0},
    {"tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777", 0},
    {"tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755", 0},
};

/*
 * With a disk root, the kernel has already mounted devtmpfs on /dev (DEVTMPFS_MOUNT); mounting
 * again would hide it. A target on another device than its parent is a mount point already.
 */
static int is_mounted(const char *target)
{
	char parent[64];
	struct stat st, pst;

	if (snprintf(parent, sizeof(parent), "%s/..", target) >= (int)sizeof(parent))
		return 0;
	if (stat(target, &st) < 0 || stat(parent, &pst) < 0)
		return 0;
	return st.st_dev != pst.st_dev;
}

static void mount_one(struct logger *log, const struct mount_spec *m)
{
	if (is_mounted(m->target))
		return;
	/* A read-only root already has the directory, or the mount below says why not. */
	if (mkdir(m->target, 0755) < 0 && errno != EEXIST && errno != EROFS)
		init_err(log, "mkdir %s: %s", m->target, strerror(errno));
	if (mount(m->source, m->target, m->fstype, m->flags, m->data) < 0 &&
	    !(m->optional && errno == ENODEV))
		init_err(log, "mount %s on %s: %s", m->fstype, m->target, strerror(errno));
}

/* What programs expect to find in /dev beyond device nodes (bash process substitution, ...). */
static void dev_links(struct logger *log)
{
	static const char *const links[][2] = {
	    {"/proc/self/fd", "/dev/fd"},
	    {"/proc/self/fd/0", "/dev/stdin"},
	    {"/proc/self/fd/1", "/dev/stdout"},
	    {"/proc/self/fd/2", "/dev/stderr"},
	};

	for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++)
		if (symlink(links[i][0], links[i][1]) < 0 && errno != EEXIST)
			init_err(log, "symlink %s: %s", links[i][1], strerror(errno));
}

void mounts_setup(struct logger *log)
{
	for (size_t i = 0; i < sizeof(mount_table) / sizeof(mount_table[0]); i++)
		mount_one(log, &mount_table[i]);
	dev_links(log);
}
