/* lifecycle/: sandbox names, the state root, lock files held across exec and ended by kill -9,
 * the event log (torn last line) and the state read from lock and log. Real files and processes. */
#include "helpers.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "common/clock.h"
#include "file_helpers.h"
#include "lifecycle/archive.h"
#include "lifecycle/broker.h"
#include "sandbox/event_log.h"
#include "lifecycle/gc.h"
#include "lifecycle/lock.h"
#include "sandbox/idle.h"
#include "lifecycle/name.h"
#include "lifecycle/policy.h"
#include "lifecycle/import.h"
#include "lifecycle/root.h"
#include "lifecycle/spec.h"
#include "lifecycle/state.h"
#include "lifecycle/tombstone.h"
#include "lifecycle/tree.h"
#include "lifecycle/vmm_args.h"

struct fx {
	char dir[64];
	struct sbx_root root;
};

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	char err[256];

	strcpy(f->dir, "/tmp/cove-life-XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	setenv("COVE_STATE_DIR", f->dir, 1);
	setenv("COVE_RUN_DIR", "/tmp/cove-life-run", 1);
	assert_int_equal(sbx_root_open(&f->root, false, err, sizeof(err)), 0);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;
	char cmd[128];

	sbx_root_close(&f->root);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", f->dir);
	assert_int_equal(system(cmd), 0);
	free(f);
	return 0;
}

static void test_names(void **state)
{
	static const char *const good[] = {"a", "0", "agent-7", "x-",
					   "abcdefghijklmnopqrstuvwxyz0123456789-abcdefghijk"};
	static const char *const bad[] = {
	    "",	   "-a", "A",	"a_b", "a.b",
	    "a/b", "..", "a b", "é",   "abcdefghijklmnopqrstuvwxyz0123456789-abcdefghijkl"};
	char err[256];

	(void)state;
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		assert_int_equal(sbx_name_check(good[i], err, sizeof(err)), 0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		assert_int_equal(sbx_name_check(bad[i], err, sizeof(err)), -EINVAL);
		assert_one_line_error(err, "name");
	}
	assert_int_equal(sbx_name_check(NULL, err, sizeof(err)), -EINVAL);
}

static void test_root_and_dirs(void **state)
{
	struct fx *f = *state;
	struct sbx_root r2;
	char err[256], path[256], link[128];
	struct stat st;
	int fd;

	/* A sandbox directory is created once, 0700, and opened again by name. */
	fd = sbx_dir_open(&f->root, "one", true, err, sizeof(err));
	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0700);
	close(fd);
	assert_int_equal(sbx_dir_open(&f->root, "one", true, err, sizeof(err)), -EEXIST);
	assert_one_line_error(err, "already exists");
	fd = sbx_dir_open(&f->root, "one", false, err, sizeof(err));
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(sbx_dir_open(&f->root, "two", false, err, sizeof(err)), -ENOENT);
	assert_one_line_error(err, "no sandbox named two");
	assert_int_equal(sbx_dir_open(&f->root, "../etc", false, err, sizeof(err)), -EINVAL);

	/* A link planted where a sandbox directory should be is not followed. */
	snprintf(link, sizeof(link), "%s/evil", f->dir);
	assert_int_equal(symlink("/tmp", link), 0);
	assert_true(sbx_dir_open(&f->root, "evil", false, err, sizeof(err)) < 0);

	/* Socket paths fit; a run directory too long for them is refused up front. */
	assert_int_equal(sbx_run_path(&f->root, "one", "vsock.sock", path, sizeof(path)), 0);
	assert_string_equal(path, "/tmp/cove-life-run/one/vsock.sock");
	setenv("COVE_RUN_DIR", "/tmp/a-runtime-directory-whose-path-is-far-too-long", 1);
	assert_int_equal(sbx_root_open(&r2, false, err, sizeof(err)), -ENAMETOOLONG);
	assert_one_line_error(err, "COVE_RUN_DIR");

	/* A state root others can write is refused (they could plant links in it). */
	setenv("COVE_RUN_DIR", "/tmp/cove-life-run", 1);
	assert_int_equal(chmod(f->dir, 0777), 0);
	assert_true(sbx_root_open(&r2, false, err, sizeof(err)) < 0);
	assert_one_line_error(err, NULL);
	assert_int_equal(chmod(f->dir, 0700), 0);
}

/* Forks a process that takes the VMM lock and execs sleep with it: the lock outlives exec. */
static pid_t hold_lock_across_exec(int dfd)
{
	int ready[2];
	char c;
	pid_t pid;

	assert_int_equal(pipe(ready), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int fd = sbx_lock_take(dfd, SBX_LOCK_VMM, false, true);

		if (fd < 0)
			_exit(1);
		if (write(ready[1], "x", 1) != 1)
			_exit(1);
		execlp("sleep", "sleep", "60", (char *)NULL);
		_exit(1);
	}
	close(ready[1]);
	assert_int_equal(read(ready[0], &c, 1), 1);
	close(ready[0]);
	usleep(100 * 1000); /* past the exec */
	return pid;
}

static void test_locks(void **state)
{
	struct fx *f = *state;
	char err[256];
	int dfd = sbx_dir_open(&f->root, "lk", true, err, sizeof(err));
	int status, fd;
	pid_t pid;

	assert_true(dfd >= 0);
	assert_int_equal(sbx_lock_held(dfd, SBX_LOCK_VMM), 0); /* no file yet */
	pid = hold_lock_across_exec(dfd);
	assert_int_equal(sbx_lock_held(dfd, SBX_LOCK_VMM), 1);
	assert_int_equal(sbx_lock_take(dfd, SBX_LOCK_VMM, false, false), -EWOULDBLOCK);
	/* kill -9 ends the lock with the process: nothing is left to clean up. */
	assert_int_equal(kill(pid, SIGKILL), 0);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_int_equal(sbx_lock_held(dfd, SBX_LOCK_VMM), 0);
	fd = sbx_lock_take(dfd, SBX_LOCK_VMM, false, false);
	assert_true(fd >= 0);
	assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	/* The lock's fd (the one a VMM inherits) is read-only: the pid in it is the host's. */
	assert_int_equal(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY);
	assert_int_equal(write(fd, "1\n", 2), -1);
	assert_int_equal(sbx_lock_write_pid(dfd, SBX_LOCK_VMM, 4242), 0);
	assert_int_equal(sbx_lock_pid(dfd, SBX_LOCK_VMM), 4242);
	close(fd);
	/* A link in place of a lock file is refused. */
	assert_int_equal(symlinkat("/tmp/x", dfd, SBX_LOCK_START), 0);
	assert_true(sbx_lock_take(dfd, SBX_LOCK_START, false, false) < 0);
	close(dfd);
}

static void test_events_and_state(void **state)
{
	struct fx *f = *state;
	struct sbx_event ev;
	enum sbx_state st;
	char err[256], path[256];
	int dfd = sbx_dir_open(&f->root, "ev", true, err, sizeof(err));
	int status, fd;
	pid_t pid;

	assert_true(dfd >= 0);
	assert_int_equal(sbx_event_last(dfd, &ev), -ENOENT);
	assert_int_equal(sbx_state_read(dfd, &st, NULL), 0);
	assert_int_equal(st, SBX_CREATING);

	/* Running per the log, and its process holds the lock. */
	assert_int_equal(sbx_event_append(dfd, "creating", "running", "cove create"), 0);
	pid = hold_lock_across_exec(dfd);
	assert_int_equal(sbx_state_read(dfd, &st, &ev), 0);
	assert_int_equal(st, SBX_RUNNING);
	assert_string_equal(ev.from, "creating");
	assert_string_equal(ev.cause, "cove create");
	assert_true(ev.time_ms > 1700000000000LL);

	/* The process died without a stop: crashed. */
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	assert_int_equal(sbx_state_read(dfd, &st, NULL), 0);
	assert_int_equal(st, SBX_CRASHED);

	/*
	 * An idle stop: the VMM leaves a note in its chain and exits; the host records the stop
	 * itself, once (the note is taken), and a symbolic link is no note.
	 */
	assert_int_equal(sbx_event_append(dfd, "crashed", "running", "cove start"), 0);
	assert_int_equal(mkdirat(dfd, SBX_CHAIN, 0700), 0);
	snprintf(path, sizeof(path), "%s/ev/%s/%s", f->dir, SBX_CHAIN, SBX_IDLE_NOTE);
	assert_int_equal(symlink("/etc/passwd", path), 0);
	assert_int_equal(sbx_state_read(dfd, &st, NULL), 0);
	assert_int_equal(st, SBX_CRASHED);
	assert_int_equal(unlink(path), 0);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(sbx_state_read(dfd, &st, &ev), 0);
	assert_int_equal(st, SBX_STOPPED);
	assert_string_equal(ev.from, "running");
	assert_string_equal(ev.to, "stopped");
	assert_string_equal(ev.cause, "idle");
	assert_int_equal(access(path, F_OK), -1);
	assert_int_equal(sbx_state_read(dfd, &st, NULL), 0);
	assert_int_equal(st, SBX_STOPPED);
	assert_int_equal(sbx_event_append(dfd, "stopped", "running", "cove start"), 0);

	/* A stop, then a torn line a crash left mid-write: the last whole line counts. */
	assert_int_equal(sbx_event_append(dfd, "running", "stopped", "cove stop"), 0);
	snprintf(path, sizeof(path), "%s/ev/%s", f->dir, SBX_EVENTS);
	fd = open(path, O_WRONLY | O_APPEND);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "{\"time\":\"20", 11), 11);
	close(fd);
	assert_int_equal(sbx_state_read(dfd, &st, &ev), 0);
	assert_int_equal(st, SBX_STOPPED);
	assert_string_equal(ev.to, "stopped");

	/* A last line that is not an event is an error, not a guess. */
	fd = open(path, O_WRONLY | O_APPEND);
	assert_int_equal(write(fd, "\n{\"to\":\"elsewhere\"}\n", 20), 20);
	close(fd);
	assert_int_equal(sbx_state_read(dfd, &st, NULL), -EINVAL);
	close(dfd);
}

/* A spec like cove create's: a kernel, 256 MiB, one vCPU, the root image under an overlay. */
static void base_spec(struct sbx_spec *s)
{
	strcpy(s->kernel, "/k/bzImage");
	strcpy(s->cmdline, "console=ttyS0");
	s->mem_bytes = 256ULL << 20;
	s->vcpus = 1;
	s->nr_disks = 1;
	strcpy(s->disks[0].path, "/base/rootfs.ext4");
	s->disks[0].overlay = true;
	s->snapshot_every_ms = 60000;
}

static void test_spec_round_trip(void **state)
{
	struct fx *f = *state;
	struct sbx_spec a = {0}, *b = calloc(1, sizeof(*b));
	char err[256], path[256];
	int dfd = sbx_dir_open(&f->root, "sp", true, err, sizeof(err));

	assert_true(dfd >= 0);
	base_spec(&a);
	a.vcpus = 2;
	a.nr_disks = 2;
	strcpy(a.disks[1].path, "/data.img");
	a.disks[1].read_only = true;
	strcpy(a.key, "key-cmd:/bin/true");
	a.snapshot_every_ms = 60000;
	a.created_ms = 1764547200000LL;
	a.disks[1].rate =
	    (struct rate_limit){.bw = 50 << 20, .bw_burst = 1, .iops = 7, .iops_burst = 2};
	a.vsock_rate = 10 << 20;
	a.no_seccomp = true;
	a.no_jail = true;
	assert_int_equal(sbx_spec_write(dfd, &a), 0);
	assert_int_equal(sbx_spec_read(dfd, b, err, sizeof(err)), 0);
	assert_memory_equal(&a, b, sizeof(a));

	/* A spec from before rate limits (no such keys) reads as no limits. */
	static const char old[] =
	    "{\"version\":1,\"kernel\":\"/k\",\"initrd\":\"\",\"cmdline\":\"\","
	    "\"key\":\"\",\"policy\":\"\",\"mem_bytes\":1,\"vcpus\":1,"
	    "\"snapshot_every_ms\":0,\"idle_stop_ms\":0,\"archive_after_ms\":0,"
	    "\"delete_after_ms\":0,\"created_ms\":0,"
	    "\"disks\":[{\"path\":\"/d\",\"ro\":false,\"overlay\":false}]}";
	snprintf(path, sizeof(path), "%s/sp/%s", f->dir, SBX_SPEC);
	write_file(path, old, strlen(old));
	assert_int_equal(sbx_spec_read(dfd, b, err, sizeof(err)), 0);
	assert_int_equal(b->nr_disks, 1);
	assert_int_equal(b->disks[0].rate.bw, 0);
	assert_int_equal(b->vsock_rate, 0);
	assert_false(b->no_seccomp);
	assert_false(b->no_jail); /* jailed, as every sandbox unless --no-jail */

	/* A spec that is not ours (or relative paths, or no kernel) is refused in one line. */
	static const char *const bad[] = {
	    "{}",
	    "[1]",
	    "{\"version\":2}",
	    "not json",
	    "{\"version\":1,\"kernel\":\"rel/k\",\"initrd\":\"\",\"cmdline\":\"\","
	    "\"key\":\"\",\"policy\":\"\",\"mem_bytes\":1,\"vcpus\":1,"
	    "\"snapshot_every_ms\":0,\"idle_stop_ms\":0,\"archive_after_ms\":0,"
	    "\"delete_after_ms\":0,\"created_ms\":0,\"disks\":[]}",
	    /* a rate out of range */
	    "{\"version\":1,\"kernel\":\"/k\",\"initrd\":\"\",\"cmdline\":\"\","
	    "\"key\":\"\",\"policy\":\"\",\"mem_bytes\":1,\"vcpus\":1,"
	    "\"snapshot_every_ms\":0,\"idle_stop_ms\":0,\"archive_after_ms\":0,"
	    "\"delete_after_ms\":0,\"created_ms\":0,\"vsock_rate\":-1,\"disks\":[]}",
	    /* no_seccomp that is not a boolean */
	    "{\"version\":1,\"kernel\":\"/k\",\"initrd\":\"\",\"cmdline\":\"\","
	    "\"key\":\"\",\"policy\":\"\",\"mem_bytes\":1,\"vcpus\":1,"
	    "\"snapshot_every_ms\":0,\"idle_stop_ms\":0,\"archive_after_ms\":0,"
	    "\"delete_after_ms\":0,\"created_ms\":0,\"no_seccomp\":1,\"disks\":[]}",
	};
	snprintf(path, sizeof(path), "%s/sp/%s", f->dir, SBX_SPEC);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		write_file(path, bad[i], strlen(bad[i]));
		err[0] = '\0';
		assert_int_equal(sbx_spec_read(dfd, b, err, sizeof(err)), -EINVAL);
		assert_one_line_error(err, SBX_SPEC);
	}
	close(dfd);
	free(b);
}

static int has_arg(const struct sbx_args *a, const char *want)
{
	for (int i = 0; i < a->argc; i++)
		if (!strcmp(a->argv[i], want))
			return 1;
	return 0;
}

static void test_vmm_args(void **state)
{
	struct fx *f = *state;
	struct sbx_spec s = {0};
	struct sbx_args *a = calloc(1, sizeof(*a));
	char want[512];

	base_spec(&s);
	assert_int_equal(sbx_args_run(a, &f->root, "box", &s), 0);
	assert_string_equal(a->argv[1], "run");
	snprintf(want, sizeof(want), "/base/rootfs.ext4,overlay=%s/box/chain/disk0.ovl", f->dir);
	assert_true(has_arg(a, want));
	assert_true(has_arg(a, "/tmp/cove-life-run/box/vsock.sock"));
	assert_true(has_arg(a, "60000ms"));
	assert_true(has_arg(a, "--track-dirty-pages"));
	assert_true(has_arg(a, "--balloon"));
	assert_null(a->argv[a->argc]);

	/* Restore names the chain and the overlay's base, never a path the chain holds. */
	strcpy(s.key, "key-cmd:/bin/k");
	assert_int_equal(sbx_args_restore(a, &f->root, "box", &s), 0);
	assert_string_equal(a->argv[1], "restore");
	snprintf(want, sizeof(want), "%s/box/chain", f->dir);
	assert_string_equal(a->argv[2], want);
	assert_true(has_arg(a, "/base/rootfs.ext4"));
	assert_true(has_arg(a, "key-cmd:/bin/k"));
	assert_false(has_arg(a, "--vsock-rate"));
	assert_false(has_arg(a, "--no-seccomp"));
	/* Jailed by default, as this user, in NAME/jail, the life lock kept, the broker's
	 * files and control socket hidden; --no-jail: none of it. */
	snprintf(want, sizeof(want), "%s/box/jail", f->dir);
	assert_true(has_arg(a, "--jail") && has_arg(a, want));
	snprintf(want, sizeof(want), "%u", (unsigned)geteuid());
	assert_true(has_arg(a, "--uid") && has_arg(a, want));
	assert_true(has_arg(a, "--jail-keep-fd") && has_arg(a, "9"));
	assert_true(has_arg(a, "/tmp/cove-life-run/box/ctl"));
	snprintf(want, sizeof(want), "%s/box/audit.jsonl", f->dir);
	assert_true(has_arg(a, want));
	s.no_jail = true;
	assert_int_equal(sbx_args_restore(a, &f->root, "box", &s), 0);
	assert_false(has_arg(a, "--jail") || has_arg(a, "--jail-hide") || has_arg(a, "--uid"));
	s.no_jail = false;

	/* --no-seccomp at create: on every start and restore. */
	s.no_seccomp = true;
	assert_int_equal(sbx_args_run(a, &f->root, "box", &s), 0);
	assert_true(has_arg(a, "--no-seccomp"));
	assert_int_equal(sbx_args_restore(a, &f->root, "box", &s), 0);
	assert_true(has_arg(a, "--no-seccomp"));
	s.no_seccomp = false;

	/* Rate limits go on every start and restore, from the spec. */
	s.disks[0].rate = (struct rate_limit){.bw = 1048576, .iops = 100};
	s.vsock_rate = 4096;
	assert_int_equal(sbx_args_run(a, &f->root, "box", &s), 0);
	snprintf(want, sizeof(want),
		 "/base/rootfs.ext4,overlay=%s/box/chain/disk0.ovl,bw=1048576,iops=100", f->dir);
	assert_true(has_arg(a, want));
	assert_true(has_arg(a, "--vsock-rate") && has_arg(a, "4096"));
	assert_int_equal(sbx_args_restore(a, &f->root, "box", &s), 0);
	assert_true(has_arg(a, "/base/rootfs.ext4,bw=1048576,iops=100"));
	assert_true(has_arg(a, "--vsock-rate") && has_arg(a, "4096"));

	/* A command line past the arena is refused, not cut. */
	memset(s.cmdline, 'x', sizeof(s.cmdline) - 1);
	for (int i = 0; i < SBX_MAX_DISKS; i++) {
		memset(s.disks[i].path, 'p', sizeof(s.disks[i].path) - 1);
		s.disks[i].path[0] = '/';
	}
	s.nr_disks = SBX_MAX_DISKS;
	assert_int_equal(sbx_args_run(a, &f->root, "box", &s), -E2BIG);
	free(a);
}

static void test_tombstone_and_tree(void **state)
{
	struct fx *f = *state;
	char err[256], msg[256], path[256];
	int dfd = sbx_dir_open(&f->root, "gone", true, err, sizeof(err));

	assert_true(dfd >= 0);
	assert_int_equal(mkdirat(dfd, "chain", 0700), 0);
	snprintf(path, sizeof(path), "%s/gone/chain/layer", f->dir);
	write_file(path, "0123456789", 10);
	assert_int_equal(symlinkat("/etc", dfd, "link"), 0);
	close(dfd);
	assert_true(sbx_tree_bytes(f->root.dfd, "gone") > 0);
	assert_int_equal(sbx_tombstone_describe(&f->root, "gone", msg, sizeof(msg)), -ENOENT);
	assert_int_equal(sbx_tombstone_write(&f->root, "gone", "cove rm"), 0);
	/* Removal takes the link, never what it points at. */
	assert_int_equal(sbx_tree_remove(f->root.dfd, "gone"), 0);
	assert_int_equal(access("/etc/passwd", F_OK) == 0 || access("/etc", F_OK) == 0, 1);
	assert_int_equal(sbx_dir_open(&f->root, "gone", false, err, sizeof(err)), -ENOENT);
	assert_int_equal(sbx_tombstone_describe(&f->root, "gone", msg, sizeof(msg)), 0);
	assert_non_null(strstr(msg, "sandbox gone was deleted on "));
	assert_non_null(strstr(msg, "(cove rm)"));
	assert_null(strchr(msg, '\n'));
	sbx_tombstone_clear(&f->root, "gone");
	assert_int_equal(sbx_tombstone_describe(&f->root, "gone", msg, sizeof(msg)), -ENOENT);
}

/* Writes `len` bytes of a pattern (sparse zeros in the middle) to dir/name. */
static void pattern_file(const char *dir, const char *name, size_t len, uint8_t seed)
{
	char path[300];
	uint8_t *buf = calloc(1, len);

	for (size_t i = 0; i < len; i++)
		buf[i] = (i > len / 4 && i < len / 2) ? 0 : (uint8_t)(i * seed + (i >> 9));
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	write_file(path, buf, len);
	free(buf);
}

static void assert_same_file(const char *a, const char *b)
{
	size_t la, lb;
	uint8_t *x = read_file(a, &la), *y = read_file(b, &lb);

	assert_int_equal(la, lb);
	assert_memory_equal(x, y, la);
	free(x);
	free(y);
}

static void test_archive_round_trip(void **state)
{
	struct fx *f = *state;
	struct sbx_archive_stats st;
	char err[256], d[200], ref[200], a[300], b[1200];
	int dfd = sbx_dir_open(&f->root, "arc", true, err, sizeof(err));

	assert_true(dfd >= 0);
	snprintf(d, sizeof(d), "%s/arc", f->dir);
	snprintf(ref, sizeof(ref), "%s/ref", f->dir);
	assert_int_equal(mkdir(ref, 0700), 0);
	assert_int_equal(mkdirat(dfd, "chain", 0700), 0);
	snprintf(a, sizeof(a), "%s/chain", d);
	pattern_file(a, "mem-000001", 3 << 20, 7);
	pattern_file(a, "chain.json", 100, 3);
	pattern_file(a, "empty", 0, 1);
	pattern_file(d, "disk0.ovl", 1 << 20, 5);
	pattern_file(d, "disk0.ovl.map", 4096, 9);
	pattern_file(d, "spec.json", 10, 1); /* not packed: host configuration stays */
	snprintf(b, sizeof(b), "cp -a %s %s/ && cp %s/disk0.ovl %s/disk0.ovl.map %s/", a, ref, d, d,
		 ref);
	assert_int_equal(system(b), 0);

	assert_int_equal(sbx_archive_pack(dfd, &st, err, sizeof(err)), 0);
	assert_int_equal(st.files, 5);
	assert_true(st.bytes_out < st.bytes_in / 2);
	assert_int_equal(faccessat(dfd, "chain", F_OK, 0), -1);
	assert_int_equal(faccessat(dfd, "disk0.ovl", F_OK, 0), -1);
	assert_int_equal(faccessat(dfd, "spec.json", F_OK, 0), 0);

	if (sbx_archive_unpack(dfd, &st, err, sizeof(err)))
		fail_msg("unpack: %s", err);
	assert_int_equal(st.files, 5);
	assert_int_equal(faccessat(dfd, SBX_ARCHIVE, F_OK, 0), -1);
	static const char *const files[] = {"chain/mem-000001", "chain/chain.json", "chain/empty"};
	for (size_t i = 0; i < 3; i++) {
		snprintf(a, sizeof(a), "%s/%s", d, files[i]);
		snprintf(b, sizeof(b), "%s/%s", ref, files[i]);
		assert_same_file(a, b);
	}
	snprintf(a, sizeof(a), "%s/disk0.ovl", d);
	snprintf(b, sizeof(b), "%s/disk0.ovl", ref);
	assert_same_file(a, b);
	close(dfd);
}

/* Rewrites the archive's manifest with `from` replaced by `to` (once). */
static void edit_manifest(const char *dir, const char *from, const char *to)
{
	char path[300];
	size_t len;
	uint8_t *m;

	snprintf(path, sizeof(path), "%s/%s/%s", dir, SBX_ARCHIVE, SBX_ARCHIVE_MANIFEST);
	m = read_file(path, &len);
	m[len] = 0;
	char *at = strstr((char *)m, from), out[8192];
	assert_non_null(at);
	snprintf(out, sizeof(out), "%.*s%s%s", (int)(at - (char *)m), m, to, at + strlen(from));
	write_file(path, out, strlen(out));
	free(m);
}

static void test_archive_hostile(void **state)
{
	struct fx *f = *state;
	struct sbx_archive_stats st;
	char err[256], d[200], a[300], save[1200];
	int dfd = sbx_dir_open(&f->root, "bad", true, err, sizeof(err));
	static const char *const edits[][3] = {
	    /* a name that climbs out, a top-level file that is not an overlay, a size smaller
	     * than the data (a bomb's shape), a digest that does not match */
	    {"\"name\":\"chain.json\"", "\"name\":\"../x\"", "not valid"},
	    {"\"area\":\"top\",\"name\":\"disk0.ovl\"", "\"area\":\"top\",\"name\":\"spec.json\"",
	     "not valid"},
	    {"\"size\":65536", "\"size\":100", "not valid"},
	    {"\"data\":65536,\"extents\":[[0,65536]]", "\"data\":100,\"extents\":[[0,100]]",
	     "larger than the manifest"},
	    {"\"extents\":[[0,65536]]", "\"extents\":[[0,60000],[50000,5536]]", "not valid"},
	    {"\"sha256\":\"", "\"sha256\":\"0", "SHA-256"},
	};

	assert_true(dfd >= 0);
	snprintf(d, sizeof(d), "%s/bad", f->dir);
	assert_int_equal(mkdirat(dfd, "chain", 0700), 0);
	snprintf(a, sizeof(a), "%s/chain", d);
	pattern_file(a, "chain.json", 65536, 3);
	pattern_file(d, "disk0.ovl", 4096, 5);
	assert_int_equal(sbx_archive_pack(dfd, &st, err, sizeof(err)), 0);
	snprintf(save, sizeof(save), "cp -a %s/%s %s/saved", d, SBX_ARCHIVE, d);
	assert_int_equal(system(save), 0);
	for (size_t i = 0; i < sizeof(edits) / sizeof(edits[0]); i++) {
		edit_manifest(d, edits[i][0], edits[i][1]);
		if (i == 5) /* keep the digest 64 hex digits */
			edit_manifest(d, "\",\"size\"", "\",\"size\"");
		err[0] = 0;
		int r = sbx_archive_unpack(dfd, &st, err, sizeof(err));
		if (i == 5 && r == -EINVAL) /* 65 digits: refused as a bad entry, also fine */
			assert_one_line_error(err, "not valid");
		else {
			assert_true(r < 0);
			assert_one_line_error(err, edits[i][2]);
		}
		/* Nothing of the archive is lost to a failed unpack. */
		assert_int_equal(faccessat(dfd, SBX_ARCHIVE "/" SBX_ARCHIVE_MANIFEST, F_OK, 0), 0);
		snprintf(save, sizeof(save), "rm -rf %s/%s && cp -a %s/saved %s/%s", d, SBX_ARCHIVE,
			 d, d, SBX_ARCHIVE);
		assert_int_equal(system(save), 0);
	}
	assert_int_equal(sbx_archive_unpack(dfd, &st, err, sizeof(err)), 0);
	close(dfd);
}

/* A checkpoint's archive (another sandbox's, copied out) replaces a clone's chain and overlays
 * (lifecycle/import.h); a link, a hidden name or a tampered entry in it is refused. */
static void test_import_archive(void **state)
{
	struct fx *f = *state;
	struct sbx_archive_stats st;
	char err[256], src[200], dst[200], ck[200], a[300], b[1200];
	int sdfd = sbx_dir_open(&f->root, "ck-src", true, err, sizeof(err));
	int ddfd = sbx_dir_open(&f->root, "ck-dst", true, err, sizeof(err));

	assert_true(sdfd >= 0 && ddfd >= 0);
	snprintf(src, sizeof(src), "%s/ck-src", f->dir);
	snprintf(dst, sizeof(dst), "%s/ck-dst", f->dir);
	snprintf(ck, sizeof(ck), "%s/checkpoint", f->dir);
	assert_int_equal(mkdirat(sdfd, "chain", 0700), 0);
	snprintf(a, sizeof(a), "%s/chain", src);
	pattern_file(a, "mem-000002", 1 << 20, 4);
	pattern_file(a, "chain.json", 300, 6);
	pattern_file(src, "disk0.ovl", 1 << 20, 8);
	/* The clone's own: replaced (chain, overlay) or gone (an overlay the archive lacks). */
	assert_int_equal(mkdirat(ddfd, "chain", 0700), 0);
	snprintf(a, sizeof(a), "%s/chain", dst);
	pattern_file(a, "mem-000001", 4096, 1);
	pattern_file(dst, "disk0.ovl", 4096, 2);
	pattern_file(dst, "disk1.ovl", 4096, 2);
	pattern_file(dst, "spec.json", 10, 1);
	snprintf(b, sizeof(b), "cp -a %s/chain %s/ref-chain && cp %s/disk0.ovl %s/ref.ovl", src,
		 f->dir, src, f->dir);
	assert_int_equal(system(b), 0);
	assert_int_equal(sbx_archive_pack(sdfd, &st, err, sizeof(err)), 0);
	snprintf(b, sizeof(b), "cp -a %s/%s %s", src, SBX_ARCHIVE, ck);
	assert_int_equal(system(b), 0);

	/* Hostile: a link, a hidden file, a tampered entry; the clone is then the caller's to
	 * remove, so each try starts from the saved checkpoint. */
	static const char *const bad[][2] = {
	    {"ln -s /etc/passwd %s/x", "not a regular file"},
	    {"cp /etc/hostname %s/.x", "not a plain file name"},
	    {"printf 'XXXX' | dd of=%s/$(ls %s | grep -v manifest | head -n 1) bs=1 seek=20 "
	     "conv=notrunc 2>/dev/null",
	     "archive: "},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		char cmd[600], dir[220];
		snprintf(dir, sizeof(dir), "%s-%zu", ck, i);
		snprintf(b, sizeof(b), "cp -a %s %s", ck, dir);
		assert_int_equal(system(b), 0);
		snprintf(cmd, sizeof(cmd), bad[i][0], dir, dir);
		assert_int_equal(system(cmd), 0);
		err[0] = 0;
		assert_true(sbx_import_archive(ddfd, dir, &st, err, sizeof(err)) < 0);
		assert_one_line_error(err, bad[i][1]);
	}

	if (sbx_import_archive(ddfd, ck, &st, err, sizeof(err)))
		fail_msg("import: %s", err);
	assert_int_equal(st.files, 3);
	snprintf(a, sizeof(a), "%s/chain/mem-000002", dst);
	snprintf(b, sizeof(b), "%s/ref-chain/mem-000002", f->dir);
	assert_same_file(a, b);
	snprintf(a, sizeof(a), "%s/disk0.ovl", dst);
	snprintf(b, sizeof(b), "%s/ref.ovl", f->dir);
	assert_same_file(a, b);
	assert_int_equal(faccessat(ddfd, "chain/mem-000001", F_OK, 0), -1);
	assert_int_equal(faccessat(ddfd, "disk1.ovl", F_OK, 0), -1);
	assert_int_equal(faccessat(ddfd, "spec.json", F_OK, 0), 0);
	assert_int_equal(faccessat(ddfd, SBX_ARCHIVE, F_OK, 0), -1);
	/* The checkpoint itself is only read. */
	snprintf(a, sizeof(a), "%s/%s", ck, SBX_ARCHIVE_MANIFEST);
	assert_int_equal(access(a, F_OK), 0);
	close(sdfd);
	close(ddfd);
}

static void test_gc_due(void **state)
{
	struct sbx_spec s = {.archive_after_ms = 7 * 86400000ULL,
			     .delete_after_ms = 30 * 86400000ULL};
	const int64_t day = 86400000, t0 = 1764547200000LL;

	(void)state;
	assert_int_equal(sbx_gc_due(SBX_STOPPED, t0, t0 + 6 * day, &s), SBX_GC_NONE);
	assert_int_equal(sbx_gc_due(SBX_STOPPED, t0, t0 + 7 * day, &s), SBX_GC_ARCHIVE);
	assert_int_equal(sbx_gc_due(SBX_CRASHED, t0, t0 + 8 * day, &s), SBX_GC_ARCHIVE);
	assert_int_equal(sbx_gc_due(SBX_ARCHIVED, t0, t0 + 8 * day, &s), SBX_GC_NONE);
	assert_int_equal(sbx_gc_due(SBX_ARCHIVED, t0, t0 + 30 * day, &s), SBX_GC_DELETE);
	assert_int_equal(sbx_gc_due(SBX_STOPPED, t0, t0 + 31 * day, &s), SBX_GC_DELETE);
	/* A running sandbox is never due, however old its last event; 0 means never. */
	assert_int_equal(sbx_gc_due(SBX_RUNNING, t0, t0 + 99 * day, &s), SBX_GC_NONE);
	assert_int_equal(sbx_gc_due(SBX_PAUSED, t0, t0 + 99 * day, &s), SBX_GC_NONE);
	s.archive_after_ms = s.delete_after_ms = 0;
	assert_int_equal(sbx_gc_due(SBX_STOPPED, t0, t0 + 99 * day, &s), SBX_GC_NONE);
	/* A clock that went back is not a deadline passed. */
	s.archive_after_ms = 1;
	assert_int_equal(sbx_gc_due(SBX_STOPPED, t0, t0 - day, &s), SBX_GC_NONE);
}

/* A stopped sandbox on disk: spec with the given deadlines, a chain file, a stop event. */
static int fake_stopped(struct fx *f, const char *name, uint64_t archive_ms, uint64_t delete_ms)
{
	struct sbx_spec s = {0};
	char err[256], path[300];
	int dfd = sbx_dir_open(&f->root, name, true, err, sizeof(err));

	assert_true(dfd >= 0);
	strcpy(s.kernel, "/k");
	s.mem_bytes = 1 << 20;
	s.vcpus = 1;
	s.archive_after_ms = archive_ms;
	s.delete_after_ms = delete_ms;
	assert_int_equal(sbx_spec_write(dfd, &s), 0);
	assert_int_equal(mkdirat(dfd, "chain", 0700), 0);
	snprintf(path, sizeof(path), "%s/%s/chain/chain.json", f->dir, name);
	write_file(path, "{}", 2);
	assert_int_equal(sbx_event_append(dfd, "running", "stopped", "cove stop"), 0);
	return dfd;
}

static void test_gc_applies(void **state)
{
	struct fx *f = *state;
	enum sbx_state st;
	char msg[256];
	int keep = fake_stopped(f, "keep", 0, 0);
	int arch = fake_stopped(f, "arch", 1, 0);
	int del = fake_stopped(f, "del", 0, 1);

	usleep(20 * 1000);
	assert_int_equal(sbx_gc(&f->root, true, true, NULL), 0); /* dry run: nothing changes */
	assert_int_equal(sbx_state_read(arch, &st, NULL), 0);
	assert_int_equal(st, SBX_STOPPED);
	assert_int_equal(sbx_gc(&f->root, false, true, NULL), 0);
	assert_int_equal(sbx_state_read(keep, &st, NULL), 0);
	assert_int_equal(st, SBX_STOPPED);
	assert_int_equal(sbx_state_read(arch, &st, NULL), 0);
	assert_int_equal(st, SBX_ARCHIVED);
	assert_int_equal(faccessat(arch, SBX_ARCHIVE "/" SBX_ARCHIVE_MANIFEST, F_OK, 0), 0);
	assert_int_equal(sbx_tombstone_describe(&f->root, "del", msg, sizeof(msg)), 0);
	assert_non_null(strstr(msg, "delete-after"));
	assert_int_equal(faccessat(f->root.dfd, "del", F_OK, AT_SYMLINK_NOFOLLOW), -1);
	close(keep);
	close(arch);
	close(del);
}

/* --policy: what cove checks before it keeps a copy (cove-broker checks the policy itself). */
static void test_policy_check(void **state)
{
	static const struct {
		const char *text, *word;
	} bad[] = {
	    {"", "empty"},
	    {"[]", "not a JSON object"},
	    {"\"x\"", "not a JSON object"},
	    {"{", "not JSON"},
	    {"{} {}", "not JSON"},
	    {"{\"a\":1,\"a\":2}", "not JSON"},
	    {"nul", "not JSON"},
	    {"{\"a\":\"\\u0000\"}", "not JSON"},
	};
	char err[256], *big, *buf;
	size_t len;
	int fd;

	(void)state;
	assert_int_equal(sbx_policy_check("{}", 2, err, sizeof(err)), 0);
	assert_int_equal(sbx_policy_check(" {\"credentials\":{}}\n", 20, err, sizeof(err)), 0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int ret = sbx_policy_check(bad[i].text, strlen(bad[i].text), err, sizeof(err));

		assert_int_equal(ret, -EINVAL);
		assert_one_line_error(err, bad[i].word);
	}
	assert_int_equal(sbx_policy_check("{}\0", 3, err, sizeof(err)), -EINVAL);
	assert_one_line_error(err, "NUL");
	/* The size cap, in the pure check and in the loader (which never reads past it). */
	big = malloc(SBX_POLICY_MAX + 2);
	assert_non_null(big);
	memset(big, ' ', SBX_POLICY_MAX + 1);
	big[0] = '{';
	big[SBX_POLICY_MAX - 1] = '}';
	assert_int_equal(sbx_policy_check(big, SBX_POLICY_MAX, err, sizeof(err)), 0);
	assert_int_equal(sbx_policy_check(big, SBX_POLICY_MAX + 1, err, sizeof(err)), -EFBIG);
	assert_one_line_error(err, "256 KiB");
	fd = open("/tmp/cove-policy-test.json", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, big, SBX_POLICY_MAX + 1), SBX_POLICY_MAX + 1);
	close(fd);
	assert_int_equal(
	    sbx_policy_load("/tmp/cove-policy-test.json", &buf, &len, err, sizeof(err)), -EFBIG);
	assert_null(buf);
	assert_int_equal(truncate("/tmp/cove-policy-test.json", SBX_POLICY_MAX), 0);
	assert_int_equal(
	    sbx_policy_load("/tmp/cove-policy-test.json", &buf, &len, err, sizeof(err)), 0);
	assert_int_equal(len, SBX_POLICY_MAX);
	assert_int_equal(buf[len], '\0');
	free(buf);
	unlink("/tmp/cove-policy-test.json");
	free(big);
	assert_int_equal(sbx_policy_load("/nonexistent/p.json", &buf, &len, err, sizeof(err)),
			 -ENOENT);
	assert_one_line_error(err, "No such file");
	assert_int_equal(sbx_policy_load("/tmp", &buf, &len, err, sizeof(err)), -EINVAL);
	assert_one_line_error(err, "not a regular file");
}

/* The copy: beneath the sandbox directory, mode 0600, replacing a link rather than following. */
static void test_policy_write(void **state)
{
	struct fx *f = *state;
	char err[256], path[128], *buf;
	size_t len;
	struct stat st;
	int dfd = sbx_dir_open(&f->root, "pol", true, err, sizeof(err));

	assert_true(dfd >= 0);
	assert_int_equal(symlinkat("/tmp/cove-policy-elsewhere", dfd, ".policy.json.tmp"), 0);
	assert_int_equal(sbx_policy_write(dfd, "{\"credentials\":{}}", 18), 0);
	assert_int_equal(access("/tmp/cove-policy-elsewhere", F_OK), -1);
	assert_int_equal(fstatat(dfd, SBX_POLICY, &st, AT_SYMLINK_NOFOLLOW), 0);
	assert_true(S_ISREG(st.st_mode));
	assert_int_equal(st.st_mode & 0777, 0600);
	assert_int_equal(faccessat(dfd, ".policy.json.tmp", F_OK, AT_SYMLINK_NOFOLLOW), -1);
	snprintf(path, sizeof(path), "%s/pol/%s", f->dir, SBX_POLICY);
	assert_int_equal(sbx_policy_load(path, &buf, &len, err, sizeof(err)), 0);
	assert_string_equal(buf, "{\"credentials\":{}}");
	free(buf);
	close(dfd);
}

static void test_broker_grant_parse(void **state)
{
	static const char *const bad[] = {
	    "{\"ok\":false,\"error\":\"no\"}",
	    "{\"ok\":true,\"epoch\":-1,\"token\":\"00112233445566778899aabbccddeeff\"}",
	    "{\"ok\":true,\"epoch\":\"1\",\"token\":\"00112233445566778899aabbccddeeff\"}",
	    "{\"ok\":true,\"epoch\":1,\"token\":\"00112233445566778899aabbccddeef\"}",
	    "{\"ok\":true,\"epoch\":1,\"token\":\"00112233445566778899aabbccddeefg\"}",
	    "{\"ok\":true,\"epoch\":1,\"token\":\"00112233445566778899AABBCCDDEEFF\"}",
	    "{\"ok\":true,\"epoch\":1}",
	    "{\"ok\":1,\"epoch\":1,\"token\":\"00112233445566778899aabbccddeeff\"}",
	};
	struct sbx_grant g;
	char err[256];
	json_t *j;

	(void)state;
	j = json_loads("{\"ok\":true,\"epoch\":7,\"token\":\"00112233445566778899aabbccddeeff\"}",
		       0, NULL);
	assert_int_equal(sbx_broker_grant_parse(j, &g, err, sizeof(err)), 0);
	assert_int_equal(g.epoch, 7);
	assert_string_equal(g.token, "00112233445566778899aabbccddeeff");
	json_decref(j);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		j = json_loads(bad[i], 0, NULL);
		assert_non_null(j);
		assert_int_equal(sbx_broker_grant_parse(j, &g, err, sizeof(err)), -EPROTO);
		assert_one_line_error(err, "grant");
		json_decref(j);
	}
}

static bool lock_gone(int rfd)
{
	for (int i = 0; i < 200; i++) {
		if (sbx_lock_held(rfd, SBX_BROKER_LOCK) == 0)
			return true;
		usleep(25 * 1000);
	}
	return false;
}

/*
 * The real cove-broker (meson sets COVE_BROKER): started under its lock, reused while alive,
 * granted epochs that go on across brokers, ended by sbx_broker_end, and its lock gone with it
 * after a kill -9.
 */
static void test_broker_process(void **state)
{
	static const char pol[] =
	    "{\"credentials\":{\"demo\":{\"helper\":[\"/bin/true\"],"
	    "\"inject\":{\"header\":\"Authorization\",\"template\":\"Bearer {password}\"},"
	    "\"allow\":{\"schemes\":[\"http\"],\"hosts\":[\"127.0.0.1\"]}}}}";
	struct fx *f = *state;
	const char *exe = getenv("COVE_BROKER");
	char err[512], policy[128], run[128];
	struct sbx_grant g1, g2, g3;
	struct stat st;
	pid_t pid, pid2;
	int dfd, rfd, efd;
	int64_t t0_ms = realtime_ms();
	uint64_t ahead;
	char num[32];

	if (!exe || access(exe, X_OK)) {
		skip(); /* built without the broker: nothing to start */
		return;
	}
	dfd = sbx_dir_open(&f->root, "brk", true, err, sizeof(err));
	assert_true(dfd >= 0);
	assert_int_equal(sbx_policy_write(dfd, pol, strlen(pol)), 0);
	snprintf(policy, sizeof(policy), "%s/brk/%s", f->dir, SBX_POLICY);
	assert_int_equal(sbx_run_dir_make(&f->root, "brk", err, sizeof(err)), 0);
	assert_int_equal(sbx_run_path(&f->root, "brk", NULL, run, sizeof(run)), 0);
	rfd = open(run, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(rfd >= 0);
	assert_int_equal(sbx_broker_end(&f->root, "brk"), 0); /* none yet: nothing to do */

	if (sbx_broker_up(&f->root, "brk", dfd, policy, err, sizeof(err)))
		fail_msg("sbx_broker_up: %s", err);
	pid = sbx_lock_pid(rfd, SBX_BROKER_LOCK);
	assert_true(pid > 0);
	/* Both guest ports: 1025 (credential requests) and 1026 (the HTTP proxy's egress). */
	assert_int_equal(fstatat(rfd, "vsock.sock_1025", &st, AT_SYMLINK_NOFOLLOW), 0);
	assert_true(S_ISSOCK(st.st_mode));
	assert_int_equal(fstatat(rfd, "vsock.sock_1026", &st, AT_SYMLINK_NOFOLLOW), 0);
	assert_true(S_ISSOCK(st.st_mode));
	assert_int_equal(sbx_broker_grant(&f->root, "brk", dfd, &g1, err, sizeof(err)), 0);
	/* Nothing recorded yet: the first broker counts from the wall clock in ms. */
	assert_true(g1.epoch > (uint64_t)t0_ms && g1.epoch <= (uint64_t)realtime_ms() + 1);
	/* A second start finds it alive and reuses it; each grant is a new epoch and token. */
	assert_int_equal(sbx_broker_up(&f->root, "brk", dfd, policy, err, sizeof(err)), 0);
	assert_int_equal(sbx_lock_pid(rfd, SBX_BROKER_LOCK), pid);
	assert_int_equal(sbx_broker_grant(&f->root, "brk", dfd, &g2, err, sizeof(err)), 0);
	assert_int_equal(g2.epoch, g1.epoch + 1);
	assert_string_not_equal(g1.token, g2.token);
	assert_int_equal(fstatat(dfd, SBX_BROKER_AUDIT, &st, AT_SYMLINK_NOFOLLOW), 0);
	assert_int_equal(fstatat(dfd, SBX_BROKER_LOG, &st, AT_SYMLINK_NOFOLLOW), 0);
	assert_int_equal(st.st_mode & 0777, 0600);

	assert_int_equal(sbx_broker_end(&f->root, "brk"), 0);
	assert_int_equal(sbx_lock_held(rfd, SBX_BROKER_LOCK), 0);
	assert_int_equal(kill(pid, 0), -1);
	/* The next broker goes on from the last epoch granted when that is ahead of the clock. */
	ahead = (uint64_t)realtime_ms() + 1000000;
	snprintf(num, sizeof(num), "%llu\n", (unsigned long long)ahead);
	efd = openat(dfd, SBX_BROKER_EPOCH, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	assert_true(efd >= 0);
	assert_int_equal(write(efd, num, strlen(num)), (ssize_t)strlen(num));
	close(efd);
	assert_int_equal(sbx_broker_up(&f->root, "brk", dfd, policy, err, sizeof(err)), 0);
	pid2 = sbx_lock_pid(rfd, SBX_BROKER_LOCK);
	assert_true(pid2 > 0 && pid2 != pid);
	assert_int_equal(sbx_broker_grant(&f->root, "brk", dfd, &g3, err, sizeof(err)), 0);
	assert_int_equal(g3.epoch, ahead + 1);
	/* kill -9 of the broker: the supervisor reaps it and the lock is gone with both. */
	assert_int_equal(kill(pid2, SIGKILL), 0);
	assert_true(lock_gone(rfd));
	assert_int_equal(sbx_broker_end(&f->root, "brk"), 0);
	/* A broker that cannot start (a policy it refuses) is one line naming why. */
	assert_int_equal(sbx_policy_write(dfd, "{\"credentials\":{\"x\":{\"colour\":1}}}", 34), 0);
	assert_int_equal(sbx_broker_up(&f->root, "brk", dfd, policy, err, sizeof(err)), -ECHILD);
	assert_one_line_error(err, "colour");
	assert_int_equal(sbx_lock_held(rfd, SBX_BROKER_LOCK), 0);
	close(rfd);
	close(dfd);
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_names),
	    cmocka_unit_test_setup_teardown(test_root_and_dirs, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_locks, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_events_and_state, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_spec_round_trip, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_vmm_args, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_tombstone_and_tree, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_archive_round_trip, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_archive_hostile, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_import_archive, setup, teardown),
	    cmocka_unit_test(test_gc_due),
	    cmocka_unit_test_setup_teardown(test_gc_applies, setup, teardown),
	    cmocka_unit_test(test_policy_check),
	    cmocka_unit_test_setup_teardown(test_policy_write, setup, teardown),
	    cmocka_unit_test(test_broker_grant_parse),
	    cmocka_unit_test_setup_teardown(test_broker_process, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
