/* Per-thread seccomp filters: a child installs each kind's filter; allowed calls pass, forbidden
 * ones end it by SIGSYS with one line naming the call and the thread. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "sandbox/seccomp_filters.h"

enum action {
	ACT_ALLOWED, /* calls every kind may make */
	ACT_EXECVE,
	ACT_SOCKET_INET,
	ACT_OPEN_NEW, /* create a file by path */
	ACT_MMAP_EXEC,
	ACT_MPROTECT_EXEC,
	ACT_FORK,	    /* clone without CLONE_THREAD */
	ACT_KVM_CREATE_VM,  /* an ioctl request no thread may make after start */
	ACT_FILE_CHANGES,   /* replace, remove, re-mode an existing file: EPERM (event loop) */
	ACT_OPEN_OLD_RW,    /* an existing file opened for writing beneath a directory fd */
	ACT_OPEN_OLD_TRUNC, /* ... or truncated by O_TRUNC, read-only mode */
};

/* The file the mutation tests aim at: made before the filter, outlives the child. */
#define OLD_FILE "/tmp/cove-seccomp-unit-old"

/* In the child: name the thread, install kind's filter, act. Exits 0 if it lived. */
static void child(enum seccomp_kind kind, enum action act, int errfd)
{
	struct rlimit no_core = {0, 0};
	setrlimit(RLIMIT_CORE, &no_core);
	dup2(errfd, STDERR_FILENO);
	char name[16];
	snprintf(name, sizeof(name), "cove-t-%s", seccomp_kind_name(kind));
	pthread_setname_np(pthread_self(), name);
	if (seccomp_trap_init())
		_exit(10);
	char err[256];
	if (seccomp_install(kind, err, sizeof(err))) {
		dprintf(errfd, "%s\n", err);
		_exit(11);
	}
	switch (act) {
	case ACT_ALLOWED: {
		struct timespec ts;
		if (clock_gettime(CLOCK_MONOTONIC, &ts) || getpid() <= 0)
			_exit(12);
		void *p =
		    mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED || mprotect(p, 4096, PROT_READ) || munmap(p, 8192))
			_exit(13);
		pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
		pthread_mutex_lock(&m);
		pthread_mutex_unlock(&m);
		if (write(errfd, "", 0) < 0)
			_exit(14);
		if (kind == SECCOMP_EVLOOP) {
			/* Unix sockets, reading by path, creating beneath a directory fd. */
			int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
			int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
			int dfd = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
			char tmp[64];
			snprintf(tmp, sizeof(tmp), "cove-seccomp-unit-%d", (int)getpid());
			int nfd =
			    dfd >= 0 ? openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL, 0600) : -1;
			if (s < 0 || fd < 0 || nfd < 0)
				_exit(15);
			/* Its own new file may not be removed either (the host cleans up). */
			if (unlinkat(dfd, tmp, 0) == 0 || errno != EPERM)
				_exit(16);
		}
		_exit(0);
	}
	case ACT_FILE_CHANGES: {
		int dfd = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		char tmp[64];
		snprintf(tmp, sizeof(tmp), "cove-seccomp-unit-%d", (int)getpid());
		int nfd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL, 0600);
		const char *old = OLD_FILE + 5;
		if (dfd < 0 || nfd < 0)
			_exit(20);
		if (renameat(dfd, tmp, dfd, old) == 0 || errno != EPERM)
			_exit(21);
		if (rename("/tmp/x-new", OLD_FILE) == 0 || errno != EPERM)
			_exit(22);
		if (renameat2(dfd, tmp, dfd, old, 0) == 0 || errno != EPERM)
			_exit(23);
		if (renameat2(dfd, tmp, dfd, old, RENAME_EXCHANGE) == 0 || errno != EPERM)
			_exit(24);
		/* no-replace: the one rename allowed, and it cannot land on an existing name */
		if (renameat2(dfd, tmp, dfd, old, RENAME_NOREPLACE) == 0 || errno != EEXIST)
			_exit(25);
		if (unlinkat(dfd, old, 0) == 0 || errno != EPERM || unlink(OLD_FILE) == 0)
			_exit(26);
		if (fchmodat(dfd, old, 0666, 0) == 0 || errno != EPERM)
			_exit(27);
		int rfd = openat(dfd, old, O_RDONLY | O_CLOEXEC);
		if (rfd < 0 || fchmod(rfd, 0666) == 0 || errno != EPERM)
			_exit(28);
		/* O_EXCL on an existing name fails rather than opening it */
		if (openat(dfd, old, O_RDWR | O_CREAT | O_EXCL, 0600) >= 0 || errno != EEXIST)
			_exit(29);
		_exit(0);
	}
	case ACT_EXECVE: {
		char *const argv[] = {"/bin/true", NULL};
		execve("/bin/true", argv, NULL);
		break;
	}
	case ACT_SOCKET_INET:
		socket(AF_INET, SOCK_STREAM, 0);
		break;
	case ACT_OPEN_NEW:
		open("/tmp/cove-seccomp-unit-new", O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
		break;
	case ACT_MMAP_EXEC:
		mmap(NULL, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		break;
	case ACT_MPROTECT_EXEC: {
		void *p = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		mprotect(p, 4096, PROT_READ | PROT_EXEC);
		break;
	}
	case ACT_FORK:
		if (fork() == 0)
			_exit(0);
		break;
	case ACT_KVM_CREATE_VM:
		ioctl(STDERR_FILENO, 0xae01 /* KVM_CREATE_VM */, 0);
		break;
	case ACT_OPEN_OLD_RW: {
		int dfd = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		openat(dfd, OLD_FILE + 5, O_RDWR | O_CLOEXEC);
		break;
	}
	case ACT_OPEN_OLD_TRUNC: {
		int dfd = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		openat(dfd, OLD_FILE + 5, O_RDONLY | O_TRUNC | O_CLOEXEC);
		break;
	}
	}
	_exit(0); /* it lived: the call was not forbidden */
}

/* Runs the child; its wait status and what it wrote on stderr. */
static int run(enum seccomp_kind kind, enum action act, char *out, size_t cap)
{
	int p[2];
	assert_int_equal(pipe(p), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(p[0]);
		child(kind, act, p[1]);
	}
	close(p[1]);
	size_t got = 0;
	ssize_t n;
	while (got < cap - 1 && (n = read(p[0], out + got, cap - 1 - got)) > 0)
		got += (size_t)n;
	out[got] = 0;
	close(p[0]);
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	return st;
}

static void expect_sigsys(enum seccomp_kind kind, enum action act, const char *call)
{
	char out[1024], want[64];
	int st = run(kind, act, out, sizeof(out));
	if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGSYS)
		fail_msg("%s: %s lived (status 0x%x): %s", seccomp_kind_name(kind), call, st, out);
	snprintf(want, sizeof(want), "forbidden system call: %s (", call);
	if (!strstr(out, want))
		fail_msg("%s: no line naming %s: '%s'", seccomp_kind_name(kind), call, out);
	snprintf(want, sizeof(want), "thread cove-t-%s ", seccomp_kind_name(kind));
	if (!strstr(out, want))
		fail_msg("%s: the line does not name the thread: '%s'", seccomp_kind_name(kind),
			 out);
}

static void test_allowed_calls_live(void **state)
{
	(void)state;
	for (int k = 0; k < SECCOMP_KINDS; k++) {
		char out[1024];
		int st = run((enum seccomp_kind)k, ACT_ALLOWED, out, sizeof(out));
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
			fail_msg("%s: allowed calls did not pass (status 0x%x): %s",
				 seccomp_kind_name((enum seccomp_kind)k), st, out);
	}
}

static void test_execve_dies(void **state)
{
	(void)state;
	for (int k = 0; k < SECCOMP_KINDS; k++)
		expect_sigsys((enum seccomp_kind)k, ACT_EXECVE, "execve");
}

static void test_inet_socket_dies(void **state)
{
	(void)state;
	for (int k = 0; k < SECCOMP_KINDS; k++)
		expect_sigsys((enum seccomp_kind)k, ACT_SOCKET_INET, "socket");
}

static void test_open_new_path_dies(void **state)
{
	(void)state;
	for (int k = 0; k < SECCOMP_KINDS; k++)
		expect_sigsys((enum seccomp_kind)k, ACT_OPEN_NEW, "openat");
	assert_int_equal(access("/tmp/cove-seccomp-unit-new", F_OK), -1);
}

/* A file made before the filter: what the mutation tests must leave as it was. */
static void old_file_make(void)
{
	unlink(OLD_FILE);
	int fd = open(OLD_FILE, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0400);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "committed", 9), 9);
	close(fd);
}

static void old_file_check(void)
{
	struct stat st;
	char buf[16] = "";
	int fd = open(OLD_FILE, O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(read(fd, buf, sizeof(buf)), 9);
	close(fd);
	assert_memory_equal(buf, "committed", 9);
	assert_int_equal(st.st_mode & 07777, 0400);
}

/* Event loop: no replace, unlink, re-mode or write-open of a file it did not make. */
static void test_old_file_stays(void **state)
{
	(void)state;
	old_file_make();
	char out[1024];
	int st = run(SECCOMP_EVLOOP, ACT_FILE_CHANGES, out, sizeof(out));
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		fail_msg("file changes: status 0x%x (exit %d): %s", st,
			 WIFEXITED(st) ? WEXITSTATUS(st) : -1, out);
	old_file_check();
	for (int k = 0; k < SECCOMP_KINDS; k++) {
		expect_sigsys((enum seccomp_kind)k, ACT_OPEN_OLD_RW, "openat");
		expect_sigsys((enum seccomp_kind)k, ACT_OPEN_OLD_TRUNC, "openat");
	}
	old_file_check();
	unlink(OLD_FILE);
	/* The children's own new files (the host's clean-up in production). */
	system("rm -f /tmp/cove-seccomp-unit-[0-9]*");
}

static void test_exec_mapping_dies(void **state)
{
	(void)state;
	for (int k = 0; k < SECCOMP_KINDS; k++) {
		expect_sigsys((enum seccomp_kind)k, ACT_MMAP_EXEC, "mmap");
		expect_sigsys((enum seccomp_kind)k, ACT_MPROTECT_EXEC, "mprotect");
	}
}

static void test_process_and_kvm_setup_die(void **state)
{
	(void)state;
	for (int k = 0; k < SECCOMP_KINDS; k++) {
		expect_sigsys((enum seccomp_kind)k, ACT_FORK, "clone");
		expect_sigsys((enum seccomp_kind)k, ACT_KVM_CREATE_VM, "ioctl");
	}
}

static void test_kind_names(void **state)
{
	(void)state;
	enum seccomp_kind k;
	assert_int_equal(seccomp_kind_parse("vcpu", &k), 0);
	assert_int_equal(k, SECCOMP_VCPU);
	assert_int_equal(seccomp_kind_parse("uffd", &k), 0);
	assert_int_equal(k, SECCOMP_UFFD);
	assert_int_equal(seccomp_kind_parse("nope", &k), -EINVAL);
	assert_null(seccomp_kind_name(SECCOMP_KINDS));
	char err[128];
	assert_int_equal(seccomp_install(SECCOMP_KINDS, err, sizeof(err)), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_kind_names),
	    cmocka_unit_test(test_allowed_calls_live),
	    cmocka_unit_test(test_execve_dies),
	    cmocka_unit_test(test_inet_socket_dies),
	    cmocka_unit_test(test_open_new_path_dies),
	    cmocka_unit_test(test_old_file_stays),
	    cmocka_unit_test(test_exec_mapping_dies),
	    cmocka_unit_test(test_process_and_kvm_setup_die),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
