/* Unit tests for sandbox/jail: path rewriting, and the jail entered in a forked child as root. */
#include "helpers.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "sandbox/jail.h"

struct fixture {
	char top[64];	 /* mkdtemp */
	char in[128];	 /* a file bound into the jail */
	char out[128];	 /* a file beside it, not bound */
	char root[128];	 /* the jail directory */
	char socks[128]; /* a directory for a socket that does not exist yet */
};

static void fixture_make(struct fixture *f)
{
	snprintf(f->top, sizeof(f->top), "/tmp/cove-jail-XXXXXX");
	assert_non_null(mkdtemp(f->top));
	snprintf(f->in, sizeof(f->in), "%s/in", f->top);
	snprintf(f->out, sizeof(f->out), "%s/out", f->top);
	snprintf(f->root, sizeof(f->root), "%s/root", f->top);
	snprintf(f->socks, sizeof(f->socks), "%s/socks", f->top);
	int fd = open(f->in, O_CREAT | O_WRONLY, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "hi", 2), 2);
	close(fd);
	/* Writable by anyone: only the read-only bind stops the jailed uid writing it. */
	assert_int_equal(chmod(f->in, 0666), 0);
	fd = open(f->out, O_CREAT | O_WRONLY, 0644);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(mkdir(f->root, 0755), 0);
	assert_int_equal(mkdir(f->socks, 0777), 0);
}

static void fixture_remove(struct fixture *f)
{
	char p[160];
	unlink(f->in);
	unlink(f->out);
	snprintf(p, sizeof(p), "%s/api.sock", f->socks);
	unlink(p);
	snprintf(p, sizeof(p), "%s/secret", f->socks);
	unlink(p);
	snprintf(p, sizeof(p), "%s/ctl/sock", f->socks);
	unlink(p);
	snprintf(p, sizeof(p), "%s/ctl", f->socks);
	rmdir(p);
	rmdir(f->socks);
	rmdir(f->root);
	rmdir(f->top);
}

static void jail_blank(struct jail *j, const char *dir)
{
	memset(j, 0, sizeof(*j));
	j->o.dir = dir;
	j->o.uid = 65534;
	j->o.gid = 65534;
}

static void test_jail_paths(void **state)
{
	(void)state;
	struct fixture f;
	fixture_make(&f);
	struct jail *j = malloc(sizeof(*j));
	assert_non_null(j);
	jail_blank(j, f.root);
	char err[256] = "";
	const char *in;

	/* A relative path through a symbolic link: rewritten to the canonical path. */
	char link[160], cwd[4096];
	snprintf(link, sizeof(link), "%s/link", f.top);
	assert_int_equal(symlink(f.in, link), 0);
	assert_non_null(getcwd(cwd, sizeof(cwd)));
	assert_int_equal(chdir(f.top), 0);
	assert_int_equal(jail_path(j, "link", JAIL_RO, &in, err, sizeof(err)), 0);
	assert_int_equal(chdir(cwd), 0);
	unlink(link);
	char canon[4096];
	assert_non_null(realpath(f.in, canon));
	assert_string_equal(in, canon);
	assert_int_equal(j->nr, 1);
	assert_string_equal(j->b[0].host, canon);
	assert_true(j->b[0].flags & JAIL_RO);
	assert_false(j->b[0].is_dir);

	/* The same file read-write: one bind, no longer read-only. */
	assert_int_equal(jail_path(j, f.in, 0, &in, err, sizeof(err)), 0);
	assert_int_equal(j->nr, 1);
	assert_false(j->b[0].flags & JAIL_RO);

	/* A socket not there yet: its directory is bound. */
	char sock[160];
	snprintf(sock, sizeof(sock), "%s/api.sock", f.socks);
	assert_int_equal(jail_path(j, sock, JAIL_PARENT, &in, err, sizeof(err)), 0);
	assert_int_equal(j->nr, 2);
	assert_true(j->b[1].is_dir);
	assert_non_null(realpath(f.socks, canon));
	assert_string_equal(j->b[1].host, canon);
	assert_non_null(strstr(in, "/socks/api.sock"));

	/* Missing without JAIL_PARENT, the host root, a non-device as a device: refused. */
	snprintf(sock, sizeof(sock), "%s/nothing", f.top);
	assert_int_equal(jail_path(j, sock, 0, &in, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "nothing"));
	assert_int_equal(jail_path(j, "/x", JAIL_PARENT, &in, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "whole host root"));
	assert_int_equal(jail_path(j, f.out, JAIL_DEV, &in, err, sizeof(err)), -EINVAL);
	assert_int_equal(jail_path(j, "", 0, &in, err, sizeof(err)), -EINVAL);

	/* A disk that is a block device keeps device access (its bind is not nodev). */
	char blk[160];
	snprintf(blk, sizeof(blk), "%s/vol", f.top);
	if (mknod(blk, S_IFBLK | 0600, makedev(7, 0)) == 0) {
		size_t k = j->nr;
		assert_int_equal(jail_path(j, blk, JAIL_RO, &in, err, sizeof(err)), 0);
		assert_int_equal(j->nr, k + 1);
		assert_true(j->b[k].flags & JAIL_DEV);
		assert_true(j->b[k].flags & JAIL_RO);
		unlink(blk);
	} else {
		assert_int_equal(errno, EPERM); /* not root: nothing to check */
	}

	/* In place, for a --disk buffer. */
	char buf[4096];
	snprintf(buf, sizeof(buf), "%s/./out", f.top);
	assert_int_equal(jail_path_buf(j, buf, sizeof(buf), JAIL_RO, err, sizeof(err)), 0);
	assert_non_null(realpath(f.out, canon));
	assert_string_equal(buf, canon);
	assert_int_equal(jail_path_buf(j, buf, 8, JAIL_RO, err, sizeof(err)), -ENAMETOOLONG);
	free(j);
	fixture_remove(&f);
}

/* --jail-hide: socks/secret reads as /dev/null, socks/ctl is an empty directory. */
static int hidden_checks(const char *socks)
{
	char p[4200], buf[8];
	struct stat st;
	snprintf(p, sizeof(p), "%s/secret", socks);
	int fd = open(p, O_RDONLY);
	if (fd < 0 || fstat(fd, &st) || !S_ISCHR(st.st_mode) || read(fd, buf, sizeof(buf)) != 0)
		return 30;
	close(fd);
	snprintf(p, sizeof(p), "%s/ctl/sock", socks);
	/* Not there, or not even searchable (an empty 0500 tmpfs of root's, for uid 65534). */
	if (access(p, F_OK) == 0 || (errno != ENOENT && errno != EACCES))
		return 31;
	snprintf(p, sizeof(p), "%s/ctl", socks);
	if (stat(p, &st) || !S_ISDIR(st.st_mode))
		return 32;
	return 0;
}

/* Exit codes of the jailed child: 0 all good, else the number of the check that failed. */
static int jailed_checks(const char *in, const char *out, int closed_fd, int kept_fd)
{
	char buf[8] = "";
	int fd = open(in, O_RDONLY);
	if (fd < 0 || read(fd, buf, sizeof(buf)) != 2 || memcmp(buf, "hi", 2))
		return 10;
	close(fd);
	if (open(in, O_WRONLY) >= 0 || errno != EROFS)
		return 11; /* bound read-only */
	if (access(out, F_OK) == 0 || errno != ENOENT)
		return 12;
	if (access("/etc/passwd", F_OK) == 0 || access("/proc/self", F_OK) == 0 ||
	    access("/bin/sh", F_OK) == 0)
		return 13;
	if (access("/dev/null", F_OK))
		return 14;
	if (mkdir("/new", 0755) == 0)
		return 15; /* the root is read-only */
	if (getuid() != 65534 || geteuid() != 65534 || getgid() != 65534)
		return 16;
	struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct d[2];
	if (syscall(SYS_capget, &h, d))
		return 17;
	if (d[0].effective || d[0].permitted || d[1].effective || d[1].permitted ||
	    d[0].inheritable || d[1].inheritable)
		return 18;
	if (prctl(PR_CAPBSET_READ, CAP_SYS_ADMIN, 0, 0, 0) != 0)
		return 19;
	if (prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1 || prctl(PR_GET_DUMPABLE, 0, 0, 0, 0))
		return 20;
	struct rlimit rl;
	if (getrlimit(RLIMIT_CORE, &rl) || rl.rlim_cur || rl.rlim_max)
		return 21;
	if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_max != JAIL_DEF_NOFILE)
		return 22;
	if (getrlimit(RLIMIT_FSIZE, &rl) || rl.rlim_max != 4096)
		return 23;
	if (fcntl(closed_fd, F_GETFD) != -1 || errno != EBADF || fcntl(kept_fd, F_GETFD) < 0)
		return 24;
	if (getpid() != 1)
		return 25; /* first process of its pid namespace */
	char host[64] = "";
	if (gethostname(host, sizeof(host)) || strcmp(host, "cove"))
		return 26;
	return 0;
}

static void test_jail_enter(void **state)
{
	(void)state;
	if (geteuid() != 0)
		skip();
	struct fixture f;
	fixture_make(&f);
	char canon_in[4096], canon_out[4096];
	assert_non_null(realpath(f.in, canon_in));
	assert_non_null(realpath(f.out, canon_out));
	/* The broker's files beside ours: shown empty (--jail-hide). */
	char p[256], canon_socks[4096], secret[200], ctl[200];
	snprintf(secret, sizeof(secret), "%s/secret", f.socks);
	int sfd = open(secret, O_CREAT | O_WRONLY, 0600);
	assert_true(sfd >= 0);
	assert_int_equal(write(sfd, "key", 3), 3);
	close(sfd);
	snprintf(ctl, sizeof(ctl), "%s/ctl", f.socks);
	assert_int_equal(mkdir(ctl, 0700), 0);
	snprintf(p, sizeof(p), "%s/sock", ctl);
	sfd = open(p, O_CREAT | O_WRONLY, 0600);
	assert_true(sfd >= 0);
	close(sfd);
	assert_non_null(realpath(f.socks, canon_socks));
	int pfd[2];
	assert_int_equal(pipe(pfd), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct jail *j = malloc(sizeof(*j));
		char err[256] = "";
		const char *in;
		struct logger log = {.level = LOG_ERROR, .out = stderr};
		if (!j)
			_exit(2);
		jail_blank(j, f.root);
		j->log = &log;
		j->o.fsize_max = 4096;
		j->o.hide[j->o.nr_hide++] = secret;
		j->o.hide[j->o.nr_hide++] = ctl;
		if (jail_path(j, f.in, JAIL_RO, &in, err, sizeof(err)) ||
		    jail_path(j, f.socks, 0, &in, err, sizeof(err)) ||
		    jail_path(j, "/dev/null", JAIL_DEV, &in, err, sizeof(err)) ||
		    jail_keep_fd(j, pfd[1])) {
			fprintf(stderr, "%s\n", err);
			_exit(3);
		}
		int r = jail_enter(j, err, sizeof(err));
		if (r) {
			fprintf(stderr, "%s\n", err);
			/* Namespaces refused (a container without CAP_SYS_ADMIN): skipped. */
			_exit(r == -EPERM ? 77 : 4);
		}
		int c = jailed_checks(canon_in, canon_out, pfd[0], pfd[1]);
		_exit(c ? c : hidden_checks(canon_socks));
	}
	close(pfd[1]);
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	close(pfd[0]);
	fixture_remove(&f);
	assert_true(WIFEXITED(st));
	if (WEXITSTATUS(st) == 77)
		skip();
	assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_jail_paths),
	    cmocka_unit_test(test_jail_enter),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
