/* `cove run --jail` and `cove restore --jail`: their host paths into the jail, then enter it. */
#include "sandbox/jail_paths.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <stdio.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/errmsg.h"
#include "sandbox/jail.h"
#include "snapshot/keyprov_relay.h"

/* A socket the VMM binds at set-up: its directory is bound (the run directory: sockets only). */
static int put_new(struct jail *j, const char **p, char *err, size_t errlen)
{
	return *p ? jail_path(j, *p, JAIL_PARENT, p, err, errlen) : 0;
}

/*
 * The console file: made here, outside the jail (0600, never through a link), and bound alone,
 * so the jail sees that one file and not the directory beside it (a sandbox's spec, locks and
 * event log live there).
 */
static int put_file(struct jail *j, const char **p, char *err, size_t errlen)
{
	if (!*p)
		return 0;
	int fd = open(*p, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	bool made = fd >= 0;
	if (!made && errno == EEXIST)
		fd = open(*p, O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errmsg(err, errlen, -errno, "jail: '%s': %s", *p, strerror(errno));
	struct stat st;
	int r = fstat(fd, &st) ? -errno : S_ISREG(st.st_mode) ? 0 : -EINVAL;
	/* Made here for the jailed user, who opens it inside. */
	if (!r && made && geteuid() == 0 && fchown(fd, (uid_t)j->o.uid, (gid_t)j->o.gid))
		r = -errno;
	close(fd);
	if (r)
		return errmsg(err, errlen, r, "jail: '%s' is not a regular file", *p);
	return jail_path(j, *p, 0, p, err, errlen);
}

/* Makes a directory cove writes into (a chain), owned by the jailed user, if absent. */
static int make_dir(struct jail *j, const char *p, char *err, size_t errlen)
{
	if (mkdir(p, 0700) == 0) {
		/* Made here for the jailed user, who would have made it inside the parent. */
		if (geteuid() == 0 && chown(p, (uid_t)j->o.uid, (gid_t)j->o.gid))
			return errmsg(err, errlen, -errno, "jail: chown '%s': %s", p,
				      strerror(errno));
	} else if (errno != EEXIST) {
		return errmsg(err, errlen, -errno, "jail: mkdir '%s': %s", p, strerror(errno));
	}
	return 0;
}

/* A directory cove writes into (a chain): made here if absent, then bound itself, never its
 * parent. */
static int put_dir(struct jail *j, const char **p, char *err, size_t errlen)
{
	if (!*p)
		return 0;
	return make_dir(j, *p, err, errlen) ?: jail_path(j, *p, 0, p, err, errlen);
}

/*
 * With a snapshot directory a disk's overlay top lives in it: the jail then binds the chain
 * directory and never the overlay's own directory (a sandbox's files may be beside it), and a
 * frozen top can be linked into the chain (a link never crosses two bind mounts: EXDEV). A
 * top named elsewhere is linked in here, outside the jail, under a new name (one file, two
 * names, data and map); one that does not exist yet is made there by the VMM. `snap` is the
 * chain directory's canonical path.
 */
static int overlay_into_chain(struct disk_opt *d, int i, const char *snap, char *err, size_t errlen)
{
	char parent[PATH_MAX], *slash;
	snprintf(parent, sizeof(parent), "%s", d->overlay);
	slash = strrchr(parent, '/');
	if (slash)
		*slash = 0;
	char canon[PATH_MAX];
	if (slash && realpath(parent[0] ? parent : "/", canon) && !strcmp(canon, snap))
		return 0; /* already there */
	uint32_t tag = 0;
	if (getrandom(&tag, sizeof(tag), 0) != (ssize_t)sizeof(tag))
		return errmsg(err, errlen, -EIO, "jail: no random name for disk %d's top", i);
	char top[PATH_MAX], map_src[PATH_MAX + 8], map_dst[PATH_MAX + 8];
	if (snprintf(top, sizeof(top), "%s/disk%d-000000-%08x.ovl", snap, i, tag) >=
		(int)sizeof(d->overlay) ||
	    snprintf(map_src, sizeof(map_src), "%s.map", d->overlay) >= (int)sizeof(map_src))
		return errmsg(err, errlen, -ENAMETOOLONG, "jail: disk %d: overlay path too long",
			      i);
	snprintf(map_dst, sizeof(map_dst), "%s.map", top);
	struct stat st;
	if (lstat(d->overlay, &st) == 0) {
		if (!S_ISREG(st.st_mode))
			return errmsg(err, errlen, -EINVAL,
				      "jail: disk %d: overlay '%s' is not a "
				      "regular file",
				      i, d->overlay);
		const char *src[2] = {d->overlay, map_src}, *dst[2] = {top, map_dst};
		for (int k = 0; k < 2; k++) {
			if (k == 1 && lstat(map_src, &st) != 0)
				break; /* no map yet: the VMM writes one */
			if (linkat(AT_FDCWD, src[k], AT_FDCWD, dst[k], 0) < 0)
				return errmsg(
				    err, errlen, -errno,
				    "jail: disk %d: cannot link its overlay '%s' into the "
				    "snapshot directory %s (it must be on the same "
				    "filesystem): %s",
				    i, src[k], snap, strerror(errno));
		}
	}
	snprintf(d->overlay, sizeof(d->overlay), "%s", top);
	return 0;
}

/* Disks: bases read-only under an overlay; an overlay top in the chain directory `snap`
 * (canonical, "" when none) is reached through it, elsewhere through its own directory. */
static int put_disks(struct jail *j, struct disk_opt *d, int nr, const char *snap, char *err,
		     size_t errlen)
{
	for (int i = 0; i < nr; i++) {
		/* Under an overlay the base is only read. */
		unsigned fl = d[i].read_only || d[i].overlay[0] ? JAIL_RO : 0;
		int r = jail_path_buf(j, d[i].path, sizeof(d[i].path), fl, err, errlen);
		if (!r && d[i].overlay[0] && snap[0])
			r = overlay_into_chain(&d[i], i, snap, err, errlen);
		if (!r && d[i].overlay[0] && !snap[0])
			r = jail_path_buf(j, d[i].overlay, sizeof(d[i].overlay), JAIL_PARENT, err,
					  errlen);
		if (r)
			return r;
	}
	return 0;
}

/* A key provider runs outside the jail, in the key relay forked now (its fd is kept). */
static int put_key_relay(struct jail *j, const char *spec, int *fd, char *err, size_t errlen)
{
	if (!spec)
		return 0;
	struct keyrelay kr;
	int r = keyrelay_start(&kr, spec, err, errlen);
	if (r)
		return r;
	*fd = kr.sock;
	return jail_keep_fd(j, kr.sock) ? errmsg(err, errlen, -E2BIG, "jail: too many fds kept")
					: 0;
}

/* The jail is never freed: the rewritten paths live in it. */
static struct jail *jail_new(const struct jail_opts *jo, struct logger *log, char *err,
			     size_t errlen, int *r)
{
	struct jail *j = malloc(sizeof(*j));
	if (!j) {
		*r = errmsg(err, errlen, -ENOMEM, "jail: out of memory");
		return NULL;
	}
	*r = jail_init(j, jo, log, err, errlen);
	if (*r) {
		free(j);
		return NULL;
	}
	return j;
}

/* What run and restore share: sockets, console, chain directories, the key relay. */
struct shared_paths {
	const char **api_sock, **console, **vsock_uds, **snap_dir, **snap_root;
	const char *key;
	int *relay_fd;
};

static int put_shared(struct jail *j, const struct shared_paths *s, char *err, size_t errlen)
{
	return put_new(j, s->api_sock, err, errlen) ?: put_file(j, s->console, err, errlen)
		?: put_new(j, s->vsock_uds, err, errlen) ?: put_dir(j, s->snap_dir, err, errlen)
		?: put_dir(j, s->snap_root, err, errlen)
		?: put_key_relay(j, s->key, s->relay_fd, err, errlen);
}

int jail_run_opts(struct run_opts *o, struct logger *log, char *err, size_t errlen)
{
	if (!o->jail.dir)
		return 0;
	int r;
	struct jail *j = jail_new(&o->jail, log, err, errlen, &r);
	if (!j)
		return r;
	struct shared_paths sp = {&o->api_sock,		&o->console,	   &o->vsock_uds,
				  &o->snapshot_dir,	&o->snapshot_root, o->snapshot_key,
				  &o->jail.key_relay_fd};
	r = jail_path(j, o->kernel, JAIL_RO, &o->kernel, err, errlen);
	if (!r && o->initrd)
		r = jail_path(j, o->initrd, JAIL_RO, &o->initrd, err, errlen);
	/* The chain directory first made (owned by the jailed user) and named canonically: disk
	 * tops go into it. */
	char snap[PATH_MAX] = "";
	if (!r && o->snapshot_dir) {
		r = make_dir(j, o->snapshot_dir, err, errlen);
		if (!r && !realpath(o->snapshot_dir, snap))
			r = errmsg(err, errlen, -errno, "jail: '%s': %s", o->snapshot_dir,
				   strerror(errno));
	}
	if (!r)
		r = put_disks(j, o->disks, o->nr_disks, snap, err, errlen)
			?: put_shared(j, &sp, err, errlen) ?: jail_enter(j, err, errlen);
	o->jail.exe_fd = j->o.exe_fd;
	return r;
}

int jail_restore_opts(struct sandbox_restore_opts *o, struct logger *log, char *err, size_t errlen)
{
	const struct jail_opts *jo = &o->jail;
	if (!jo->dir)
		return 0;
	int r;
	struct jail *j = jail_new(jo, log, err, errlen, &r);
	if (!j)
		return r;
	struct shared_paths sp = {&o->api_sock,	 &o->console, &o->vsock_uds,	    &o->snap_dir,
				  &o->snap_root, o->key,      &o->jail.key_relay_fd};
	r = jail_path(j, o->dir, 0, &o->dir, err, errlen);
	if (!r)
		r = put_disks(j, o->disks, o->nr_disks, "", err, errlen)
			?: put_shared(j, &sp, err, errlen);
	if (!r && o->phase_dir)
		r = jail_path(j, o->phase_dir, 0, &o->phase_dir, err, errlen);
	if (!r && o->ready_fd >= 0)
		r = jail_keep_fd(j, o->ready_fd);
	if (!r && o->lazy_fd > 2)
		r = jail_keep_fd(j, o->lazy_fd);
	if (!r)
		r = jail_enter(j, err, errlen);
	o->jail.exe_fd = j->o.exe_fd;
	return r;
}
