/* The jail: namespaces, a tmpfs root with this sandbox's paths bound in, no privileges, limits. */
#include "sandbox/jail.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <grp.h>

#include "common/caps.h"
#include "common/errmsg.h"
#include "common/file_io.h"
#include "common/userns.h"
#include "sandbox/jail_cgroup.h"

int jail_opts_check(const struct jail_opts *o, char *err, size_t errlen)
{
	if (!o->dir) {
		if (o->uid >= 0 || o->gid >= 0 || o->mem_max || o->cpu_max_pct || o->pids_max ||
		    o->fsize_max || o->nofile)
			return errmsg(err, errlen, -EINVAL,
				      "--uid, --gid and --jail-* need --jail DIR");
		return 0;
	}
	if (o->dir[0] != '/')
		return errmsg(err, errlen, -EINVAL, "--jail: '%s' is not an absolute path", o->dir);
	if (o->uid < 0 || o->gid < 0)
		return errmsg(err, errlen, -EINVAL, "--jail needs --uid N and --gid N");
	return 0;
}

int jail_init(struct jail *j, const struct jail_opts *o, struct logger *log, char *err,
	      size_t errlen)
{
	memset(j, 0, sizeof(*j));
	j->o = *o;
	j->o.exe_fd = -1; /* an output of jail_enter */
	for (int i = 0; i < o->nr_keep && i < 4; i++)
		j->keep_fds[j->nr_keep++] = o->keep[i];
	j->log = log;
	int r = jail_opts_check(o, err, errlen);
	if (r)
		return r;
	const char *unused;
	r = jail_path(j, "/dev/kvm", JAIL_DEV, &unused, err, errlen);
	if (!r)
		r = jail_path(j, "/dev/null", JAIL_DEV, &unused, err, errlen);
	/* Lazy restore of an encrypted chain without CAP_SYS_PTRACE (snapshot/lazy_mem.c). */
	if (!r && access("/dev/userfaultfd", F_OK) == 0)
		r = jail_path(j, "/dev/userfaultfd", JAIL_DEV, &unused, err, errlen);
	return r;
}

/* The bind already covering `host` exactly, or NULL. */
static struct jail_bind *bind_find(struct jail *j, const char *host)
{
	for (int i = 0; i < j->nr; i++)
		if (!strcmp(j->b[i].host, host))
			return &j->b[i];
	return NULL;
}

int jail_path(struct jail *j, const char *path, unsigned flags, const char **inside, char *err,
	      size_t errlen)
{
	char canon[PATH_MAX], bindp[PATH_MAX];
	if (!path || !*path || strlen(path) >= JAIL_PATH_MAX)
		return errmsg(err, errlen, -EINVAL, "jail: path must be 1 to %d bytes long",
			      JAIL_PATH_MAX - 1);
	if (j->nr_inside >= JAIL_MAX_PATHS)
		return errmsg(err, errlen, -E2BIG, "jail: more than %d paths", JAIL_MAX_PATHS);
	if (flags & JAIL_PARENT) {
		char tmp[PATH_MAX];
		snprintf(tmp, sizeof(tmp), "%s", path);
		const char *base = basename(tmp);
		if (!*base || !strcmp(base, ".") || !strcmp(base, "..") || !strcmp(base, "/"))
			return errmsg(err, errlen, -EINVAL, "jail: '%s' does not name a file",
				      path);
		char base_copy[NAME_MAX + 1];
		snprintf(base_copy, sizeof(base_copy), "%s", base);
		snprintf(tmp, sizeof(tmp), "%s", path);
		if (!realpath(dirname(tmp), bindp))
			return errmsg(err, errlen, -errno, "jail: directory of '%s': %s", path,
				      strerror(errno));
		int n = snprintf(canon, sizeof(canon), "%s/%s", strcmp(bindp, "/") ? bindp : "",
				 base_copy);
		if (n < 0 || (size_t)n >= JAIL_PATH_MAX)
			return errmsg(err, errlen, -ENAMETOOLONG, "jail: '%s' is too long", path);
	} else {
		if (!realpath(path, canon))
			return errmsg(err, errlen, -errno, "jail: '%s': %s", path, strerror(errno));
		snprintf(bindp, sizeof(bindp), "%s", canon);
	}
	if (!strcmp(bindp, "/"))
		return errmsg(err, errlen, -EINVAL, "jail: '%s' would bind the whole host root",
			      path);
	struct stat st;
	if (stat(bindp, &st))
		return errmsg(err, errlen, -errno, "jail: '%s': %s", bindp, strerror(errno));
	struct jail_bind *b = bind_find(j, bindp);
	if (b) {
		b->flags &= flags | ~(unsigned)JAIL_RO; /* read-write wins */
	} else {
		if (j->nr >= JAIL_MAX_PATHS)
			return errmsg(err, errlen, -E2BIG, "jail: more than %d paths",
				      JAIL_MAX_PATHS);
		b = &j->b[j->nr++];
		snprintf(b->host, sizeof(b->host), "%s", bindp);
		b->flags = flags & ~(unsigned)JAIL_PARENT;
		b->is_dir = S_ISDIR(st.st_mode);
		if ((flags & JAIL_DEV) && !S_ISCHR(st.st_mode))
			return errmsg(err, errlen, -EINVAL, "jail: '%s' is not a device", bindp);
		/* A disk that is a block device (a volume, the box's virtio disk) stays one. */
		if (S_ISBLK(st.st_mode))
			b->flags |= JAIL_DEV;
	}
	char *out = j->inside[j->nr_inside++];
	snprintf(out, JAIL_PATH_MAX, "%s", canon);
	*inside = out;
	return 0;
}

int jail_path_buf(struct jail *j, char *path, size_t len, unsigned flags, char *err, size_t errlen)
{
	const char *in;
	int r = jail_path(j, path, flags, &in, err, errlen);
	if (r)
		return r;
	if (strlen(in) >= len)
		return errmsg(err, errlen, -ENAMETOOLONG, "jail: '%s' is longer than %zu bytes", in,
			      len - 1);
	snprintf(path, len, "%s", in);
	return 0;
}

int jail_keep_fd(struct jail *j, int fd)
{
	if (j->nr_keep >= JAIL_MAX_KEEP)
		return -E2BIG;
	j->keep_fds[j->nr_keep++] = fd;
	return 0;
}

/* Not root: a user namespace where `uid`/`gid` are the caller's own ids. */
static int enter_userns(const struct jail *j, char *err, size_t errlen)
{
	int r = userns_enter((uid_t)j->o.uid, (gid_t)j->o.gid);

	if (r)
		return errmsg(err, errlen, r, "jail: user namespace: %s", strerror(-r));
	return 0;
}

/* mkdir -p of `path`'s directories (below the tmpfs root, so nothing is a link). */
static int make_parents(const char *path)
{
	char tmp[PATH_MAX];
	snprintf(tmp, sizeof(tmp), "%s", path);
	for (char *p = tmp + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(tmp, 0755) && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	return 0;
}

/* Bind one host path to the same path under `root`; flags the host mount locks are kept. */
static int bind_one(const char *root, const struct jail_bind *b, char *err, size_t errlen)
{
	char dst[PATH_MAX];
	int n = snprintf(dst, sizeof(dst), "%s%s", root, b->host);
	if (n < 0 || (size_t)n >= sizeof(dst))
		return errmsg(err, errlen, -ENAMETOOLONG, "jail: '%s' is too long", b->host);
	int r = make_parents(dst);
	if (r)
		return errmsg(err, errlen, r, "jail: mkdir for '%s': %s", dst, strerror(-r));
	if (b->is_dir) {
		if (mkdir(dst, 0755) && errno != EEXIST)
			return errmsg(err, errlen, -errno, "jail: mkdir '%s': %s", dst,
				      strerror(errno));
	} else {
		int fd = open(dst, O_CREAT | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (fd < 0)
			return errmsg(err, errlen, -errno, "jail: mount point '%s': %s", dst,
				      strerror(errno));
		close(fd);
	}
	if (mount(b->host, dst, NULL, MS_BIND | MS_REC, NULL))
		return errmsg(err, errlen, -errno, "jail: bind '%s': %s", b->host, strerror(errno));
	struct statvfs sv;
	unsigned long fl = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NOEXEC;
	if (statvfs(b->host, &sv) == 0) {
		fl |= sv.f_flag & ST_RDONLY ? MS_RDONLY : 0;
		fl |= sv.f_flag & ST_NODEV ? MS_NODEV : 0;
		fl |= sv.f_flag & ST_NOATIME ? MS_NOATIME : 0;
		fl |= sv.f_flag & ST_NODIRATIME ? MS_NODIRATIME : 0;
		fl |= sv.f_flag & ST_RELATIME ? MS_RELATIME : 0;
	}
	fl |= b->flags & JAIL_RO ? MS_RDONLY : 0;
	fl |= b->flags & JAIL_DEV ? 0 : MS_NODEV;
	if (mount(NULL, dst, NULL, fl, NULL))
		return errmsg(err, errlen, -errno, "jail: remount '%s': %s", dst, strerror(errno));
	return 0;
}

/*
 * --jail-hide: `path` (inside a bound directory) shown as an empty read-only directory or as
 * /dev/null; a path the jail does not show, or that does not exist, needs nothing.
 */
static int hide_one(const char *root, const char *path, char *err, size_t errlen)
{
	char dst[PATH_MAX], real[PATH_MAX];
	struct stat st;
	/* Binds sit at canonical host paths: so does what hides part of one. */
	if (!realpath(path, real))
		return 0;
	if (snprintf(dst, sizeof(dst), "%s%s", root, real) >= (int)sizeof(dst))
		return errmsg(err, errlen, -ENAMETOOLONG, "jail: '%s' is too long", path);
	if (lstat(dst, &st))
		return 0;
	if (S_ISDIR(st.st_mode)) {
		if (mount("cove-hidden", dst, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
			  "size=4k,nr_inodes=1,mode=0500"))
			return errmsg(err, errlen, -errno, "jail: hide '%s': %s", path,
				      strerror(errno));
		return 0;
	}
	if (S_ISLNK(st.st_mode))
		return errmsg(err, errlen, -ELOOP, "jail: hide '%s': a symbolic link", path);
	if (mount("/dev/null", dst, NULL, MS_BIND, NULL) ||
	    mount(NULL, dst, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC, NULL))
		return errmsg(err, errlen, -errno, "jail: hide '%s': %s", path, strerror(errno));
	return 0;
}

static int bind_len_cmp(const void *a, const void *b)
{
	size_t la = strlen(((const struct jail_bind *)a)->host);
	size_t lb = strlen(((const struct jail_bind *)b)->host);
	return la < lb ? -1 : la > lb;
}

/* A tmpfs on DIR holding the binds, read-only once populated, then made the root. */
static int build_root(struct jail *j, char *err, size_t errlen)
{
	const char *root = j->o.dir;
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL))
		return errmsg(err, errlen, -errno, "jail: make mounts private: %s",
			      strerror(errno));
	if (mount("cove-jail", root, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
		  "size=64k,nr_inodes=256,mode=0755"))
		return errmsg(err, errlen, -errno, "jail: tmpfs on '%s': %s", root,
			      strerror(errno));
	/* Parents before children, so a bound directory does not hide a bind beneath it. */
	qsort(j->b, (size_t)j->nr, sizeof(j->b[0]), bind_len_cmp);
	for (int i = 0; i < j->nr; i++) {
		int r = bind_one(root, &j->b[i], err, errlen);
		if (r)
			return r;
	}
	for (int i = 0; i < j->o.nr_hide; i++) {
		int r = hide_one(root, j->o.hide[i], err, errlen);
		if (r)
			return r;
	}
	if (mount(NULL, root, NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
		  NULL))
		return errmsg(err, errlen, -errno, "jail: remount the root read-only: %s",
			      strerror(errno));
	if (chdir(root))
		return errmsg(err, errlen, -errno, "jail: chdir '%s': %s", root, strerror(errno));
	if (syscall(SYS_pivot_root, ".", ".") == 0) {
		/* The old root sits on top of the new one: detach it. */
		if (umount2(".", MNT_DETACH))
			return errmsg(err, errlen, -errno, "jail: detach the old root: %s",
				      strerror(errno));
	} else if (errno == EINVAL) {
		/* / is an initramfs (the KVM box): it cannot be pivoted away from. */
		if (mount(root, "/", NULL, MS_MOVE, NULL))
			return errmsg(err, errlen, -errno, "jail: move '%s' onto /: %s", root,
				      strerror(errno));
		if (chroot("."))
			return errmsg(err, errlen, -errno, "jail: chroot: %s", strerror(errno));
	} else {
		return errmsg(err, errlen, -errno, "jail: pivot_root: %s", strerror(errno));
	}
	if (chdir("/"))
		return errmsg(err, errlen, -errno, "jail: chdir /: %s", strerror(errno));
	return 0;
}

static int fd_cmp(const void *a, const void *b)
{
	return *(const int *)a - *(const int *)b;
}

/* Every fd past stderr closed except the kept ones. */
static int close_inherited(struct jail *j)
{
	unsigned lo = 3;
	qsort(j->keep_fds, (size_t)j->nr_keep, sizeof(int), fd_cmp);
	for (int i = 0; i < j->nr_keep; i++) {
		unsigned k = (unsigned)j->keep_fds[i];
		if (k < lo)
			continue;
		if (k > lo && syscall(SYS_close_range, lo, k - 1, 0))
			return -errno;
		lo = k + 1;
	}
	return syscall(SYS_close_range, lo, ~0U, 0) ? -errno : 0;
}

static int set_limits(const struct jail *j, char *err, size_t errlen)
{
	struct {
		int res;
		const char *name;
		rlim_t v;
	} lim[] = {
	    {RLIMIT_NOFILE, "NOFILE", j->o.nofile ? j->o.nofile : JAIL_DEF_NOFILE},
	    {RLIMIT_FSIZE, "FSIZE", j->o.fsize_max ? j->o.fsize_max : JAIL_DEF_FSIZE},
	    {RLIMIT_CORE, "CORE", 0},
	};
	for (size_t i = 0; i < sizeof(lim) / sizeof(lim[0]); i++) {
		struct rlimit rl = {lim[i].v, lim[i].v};
		if (setrlimit(lim[i].res, &rl))
			return errmsg(err, errlen, -errno, "jail: RLIMIT_%s: %s", lim[i].name,
				      strerror(errno));
	}
	/* Past FSIZE a write fails with EFBIG (an I/O error the device reports), not a signal. */
	signal(SIGXFSZ, SIG_IGN);
	return 0;
}

/* Bounding and ambient sets emptied, then uid/gid, then no capability left at all. */
static int drop_privileges(const struct jail *j, char *err, size_t errlen)
{
	char why[128];
	int r = caps_drop_bounding(why, sizeof(why));
	if (r)
		return errmsg(err, errlen, r, "jail: %s", why);
	gid_t gid = (gid_t)j->o.gid;
	uid_t uid = (uid_t)j->o.uid;
	if (setgroups(1, &gid) && errno != EPERM)
		return errmsg(err, errlen, -errno, "jail: setgroups: %s", strerror(errno));
	if (setresgid(gid, gid, gid))
		return errmsg(err, errlen, -errno, "jail: gid %u: %s", (unsigned)gid,
			      strerror(errno));
	if (setresuid(uid, uid, uid))
		return errmsg(err, errlen, -errno, "jail: uid %u: %s", (unsigned)uid,
			      strerror(errno));
	r = caps_drop_all(why, sizeof(why));
	if (r)
		return errmsg(err, errlen, r, "jail: %s", why);
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	return 0;
}

/* The pid namespace's parent: passes termination signals on, exits as the sandbox did. */
static void wait_sandbox(pid_t child)
{
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	sigaddset(&set, SIGCHLD);
	sigprocmask(SIG_BLOCK, &set, NULL);
	for (;;) {
		int st;
		pid_t p = waitpid(child, &st, WNOHANG);
		if (p == child)
			_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
		int sig;
		if (sigwait(&set, &sig) == 0 && sig != SIGCHLD)
			kill(child, sig);
	}
}

int jail_enter(struct jail *j, char *err, size_t errlen)
{
	int r;
	if (!j->o.dir)
		return 0;
	struct stat st;
	if (stat(j->o.dir, &st) || !S_ISDIR(st.st_mode))
		return errmsg(err, errlen, -ENOTDIR, "jail: '%s' is not a directory", j->o.dir);
	/* The binary, while /proc is there: the spawner starts clones from it. */
	if (j->o.exe_fd < 0) {
		j->o.exe_fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
		if (j->o.exe_fd < 0)
			return errmsg(err, errlen, -errno, "jail: open /proc/self/exe: %s",
				      strerror(errno));
		r = jail_keep_fd(j, j->o.exe_fd);
		if (r)
			return errmsg(err, errlen, r, "jail: too many fds kept");
	}
	r = close_inherited(j);
	if (r)
		return errmsg(err, errlen, r, "jail: close inherited fds: %s", strerror(-r));
	/* Before the namespaces: the cgroup tree is the host's. */
	jail_cgroup_limits(&j->o, j->log);
	if (geteuid() != 0 && (r = enter_userns(j, err, errlen)))
		return r;
	int ns = CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET | CLONE_NEWCGROUP;
	if (!j->o.no_pid_ns)
		ns |= CLONE_NEWPID;
	if (unshare(ns))
		return errmsg(err, errlen, -errno, "jail: namespaces: %s", strerror(errno));
	if (sethostname("cove", 4))
		return errmsg(err, errlen, -errno, "jail: hostname: %s", strerror(errno));
	r = build_root(j, err, errlen);
	if (!r)
		r = set_limits(j, err, errlen);
	if (!r)
		r = drop_privileges(j, err, errlen);
	if (r || j->o.no_pid_ns)
		return r;
	pid_t pid = fork();
	if (pid < 0)
		return errmsg(err, errlen, -errno, "jail: fork into the pid namespace: %s",
			      strerror(errno));
	if (pid > 0)
		wait_sandbox(pid);
	/* The sandbox: pid 1 of its namespace, gone with its waiter. */
	prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
	return 0;
}
