/* Per-thread seccomp-BPF filters (libseccomp) of the guest-running process; SECCOMP.md beside. */
#include "sandbox/seccomp_filters.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/kvm.h>
#include <linux/userfaultfd.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <termios.h>
#include <unistd.h>

#include "common/errmsg.h"
#include "sandbox/syscall_names.h" /* generated: tools/gen-syscall-names */

#define V   (1u << SECCOMP_VCPU)
#define E   (1u << SECCOMP_EVLOOP)
#define U   (1u << SECCOMP_UFFD)
#define ALL (V | E | U)

/*
 * The single list of calls allowed without an argument check, per thread kind (V vCPU,
 * E event loop and the threads it starts, U userfaultfd). Calls allowed only with certain
 * arguments (ioctl, mmap, mprotect, openat, socket, socketpair, clone, prctl) are in
 * add_arg_rules below. Anything else traps. SECCOMP.md explains each group.
 */
static const struct {
	int nr;
	unsigned kinds;
} plain_calls[] = {
    /* every thread: memory, locks, time, signals (the SIGSYS reporter needs these), exit */
    {SCMP_SYS(read), ALL},
    {SCMP_SYS(write), ALL},
    {SCMP_SYS(writev), ALL},
    {SCMP_SYS(close), ALL},
    {SCMP_SYS(futex), ALL},
    {SCMP_SYS(brk), ALL},
    {SCMP_SYS(munmap), ALL},
    {SCMP_SYS(madvise), ALL},
    {SCMP_SYS(clock_gettime), ALL},
    {SCMP_SYS(clock_nanosleep), ALL},
    {SCMP_SYS(nanosleep), ALL},
    {SCMP_SYS(sched_yield), ALL},
    {SCMP_SYS(getrandom), ALL},
    {SCMP_SYS(getpid), ALL},
    {SCMP_SYS(gettid), ALL},
    {SCMP_SYS(tgkill), ALL},
    {SCMP_SYS(rt_sigaction), ALL},
    {SCMP_SYS(rt_sigprocmask), ALL},
    {SCMP_SYS(rt_sigreturn), ALL},
    {SCMP_SYS(restart_syscall), ALL},
    {SCMP_SYS(sigaltstack), ALL}, /* sanitizer runtimes set and drop one per thread */
    {SCMP_SYS(newfstatat), ALL},
    {SCMP_SYS(fstat), ALL},
    {SCMP_SYS(exit), ALL},
    {SCMP_SYS(exit_group), ALL},
    /* vCPU exits dispatched to devices (console out, notifications, blk submissions) */
    {SCMP_SYS(pread64), V | E | U},
    {SCMP_SYS(pwrite64), V | E},
    {SCMP_SYS(preadv), V | E},
    {SCMP_SYS(pwritev), V | E},
    {SCMP_SYS(io_uring_enter), V | E},
    {SCMP_SYS(epoll_ctl), V | E},
    {SCMP_SYS(sendmsg), V | E},
    {SCMP_SYS(sendto), V | E},
    {SCMP_SYS(recvmsg), V | E},
    {SCMP_SYS(recvfrom), V | E},
    {SCMP_SYS(fsync), V | E},
    {SCMP_SYS(fdatasync), V | E},
    {SCMP_SYS(fallocate), V | E},
    {SCMP_SYS(lseek), V | E},
    /* the userfaultfd thread waits on its fd and the stop eventfd */
    {SCMP_SYS(poll), E | U},
    {SCMP_SYS(ppoll), E | U},
    /* event loop: epoll, timers, sockets (families checked in socket/socketpair) */
    {SCMP_SYS(readv), E},
    {SCMP_SYS(epoll_wait), E},
    {SCMP_SYS(epoll_pwait), E},
    {SCMP_SYS(epoll_create1), E},
    {SCMP_SYS(eventfd2), E},
    {SCMP_SYS(timerfd_create), E},
    {SCMP_SYS(timerfd_settime), E},
    {SCMP_SYS(timerfd_gettime), E},
    {SCMP_SYS(select), E},
    {SCMP_SYS(pselect6), E},
    {SCMP_SYS(pipe2), E},
    {SCMP_SYS(dup), E},
    {SCMP_SYS(dup2), E},
    {SCMP_SYS(dup3), E},
    {SCMP_SYS(fcntl), E},
    {SCMP_SYS(accept), E},
    {SCMP_SYS(accept4), E},
    {SCMP_SYS(bind), E},
    {SCMP_SYS(listen), E},
    {SCMP_SYS(connect), E},
    {SCMP_SYS(shutdown), E},
    {SCMP_SYS(getsockopt), E},
    {SCMP_SYS(setsockopt), E},
    {SCMP_SYS(getsockname), E},
    {SCMP_SYS(getpeername), E},
    /* snapshots: files beneath the chain directory, compaction copies, the io_uring writer
       (its ring is made before the filters: it swaps its file and buffer with io_uring_register) */
    {SCMP_SYS(statx), E},
    {SCMP_SYS(fstatfs), E},
    {SCMP_SYS(getdents64), E},
    {SCMP_SYS(readlinkat), E},
    {SCMP_SYS(mkdirat), E},
    {SCMP_SYS(flock), E}, /* an encrypted chain's layer-id counter */
    /* a clone adopts its parent's frozen disk layers by a new link (a link never replaces, and
       the new name is as unwritable as the old: see the openat rules) */
    {SCMP_SYS(linkat), E},
    /* a new API snapshot directory */
    {SCMP_SYS(mkdir), E},
    {SCMP_SYS(access), E},
    {SCMP_SYS(faccessat), E},
    {SCMP_SYS(faccessat2), E},
    {SCMP_SYS(readlink), E},
    {SCMP_SYS(getcwd), E},
    {SCMP_SYS(ftruncate), E},
    {SCMP_SYS(copy_file_range), E},
    {SCMP_SYS(sendfile), E},
    {SCMP_SYS(mremap), E},
    {SCMP_SYS(mlock), E},
    {SCMP_SYS(munlock), E},
    {SCMP_SYS(io_uring_register), E},
    /* clones: reaped by pid; threads the loop starts (clone is checked below) */
    {SCMP_SYS(wait4), E},
    {SCMP_SYS(kill), E},
    {SCMP_SYS(set_robust_list), E},
    {SCMP_SYS(rseq), E},
    {SCMP_SYS(sched_getaffinity), E},
    {SCMP_SYS(sysinfo), E},
    {SCMP_SYS(uname), E},
    {SCMP_SYS(getuid), E},
    {SCMP_SYS(geteuid), E},
    {SCMP_SYS(getgid), E},
    {SCMP_SYS(getegid), E},
};

/*
 * Calls that would change a file the VMM did not make in this run (replace, remove or re-mode
 * it): refused with EPERM in every thread, so the VMM's own best-effort clean-ups (a temporary
 * file after a failed write, its socket at stop) fail quietly and the host cleans up instead.
 * A committed layer, the chain's earlier files, a sibling clone's shared layers: none of them
 * can be rewritten, replaced, unlinked or made writable from inside (SECCOMP.md, "Files").
 */
static const int refused_file_calls[] = {
    SCMP_SYS(unlink), SCMP_SYS(unlinkat), SCMP_SYS(rmdir), SCMP_SYS(rename),   SCMP_SYS(renameat),
    SCMP_SYS(fchmod), SCMP_SYS(fchmodat), SCMP_SYS(chmod), SCMP_SYS(truncate),
};

/* KVM ioctls on vCPU fds from the vCPU thread: run, and read rip for a fatal exit's message. */
static const unsigned long vcpu_ioctls[] = {
    KVM_RUN,
    KVM_GET_REGS,
    KVM_IRQ_LINE, /* legacy devices raise lines from the exit they handle */
    KVM_IRQ_LINE_STATUS,
};

/*
 * The event loop: a snapshot reads every vCPU's and the VM's state and dirty log (and turns
 * dirty logging on at the first full one); devices wire their irqfd/ioeventfd when the guest
 * activates them; a few non-KVM ones (terminal check by stdio, non-blocking I/O, bytes queued).
 */
static const unsigned long evloop_ioctls[] = {
    KVM_GET_REGS,
    KVM_GET_SREGS,
    KVM_GET_FPU,
    KVM_GET_XSAVE,
    KVM_GET_XCRS,
    KVM_GET_DEBUGREGS,
    KVM_GET_LAPIC,
    KVM_GET_VCPU_EVENTS,
    KVM_GET_MP_STATE,
    KVM_GET_MSRS,
    KVM_GET_MSR_INDEX_LIST,
    KVM_GET_CLOCK,
    KVM_GET_PIT2,
    KVM_GET_IRQCHIP,
    KVM_GET_DIRTY_LOG,
    KVM_CLEAR_DIRTY_LOG,
    KVM_SET_USER_MEMORY_REGION,
    KVM_CHECK_EXTENSION,
    KVM_ENABLE_CAP,
    KVM_IRQFD,
    KVM_IOEVENTFD,
    KVM_IRQ_LINE,
    KVM_IRQ_LINE_STATUS,
    TCGETS,
    FIONBIO,
    FIONREAD,
    FIOCLEX,
};

static const unsigned long uffd_ioctls[] = {
    UFFDIO_COPY,
    UFFDIO_ZEROPAGE,
    UFFDIO_WAKE,
};

static const char *const kind_names[SECCOMP_KINDS] = {
    [SECCOMP_VCPU] = "vcpu",
    [SECCOMP_EVLOOP] = "evloop",
    [SECCOMP_UFFD] = "uffd",
};

const char *seccomp_kind_name(enum seccomp_kind kind)
{
	return (unsigned)kind < SECCOMP_KINDS ? kind_names[kind] : NULL;
}

int seccomp_kind_parse(const char *name, enum seccomp_kind *out)
{
	for (int k = 0; k < SECCOMP_KINDS; k++)
		if (!strcmp(name, kind_names[k])) {
			*out = (enum seccomp_kind)k;
			return 0;
		}
	return -EINVAL;
}

bool seccomp_sanitized_build(void)
{
#if defined(COVE_SANITIZED) || defined(__SANITIZE_ADDRESS__)
	return true;
#else
	return false;
#endif
}

/* Async-signal-safe: only write(2) on fixed buffers. */
static size_t put(char *buf, size_t at, size_t cap, const char *s)
{
	while (*s && at < cap)
		buf[at++] = *s++;
	return at;
}

static size_t put_num(char *buf, size_t at, size_t cap, long v)
{
	char d[24];
	int n = 0;
	unsigned long u = v < 0 ? (unsigned long)-v : (unsigned long)v;
	do
		d[n++] = (char)('0' + u % 10);
	while ((u /= 10) && n < (int)sizeof(d));
	if (v < 0 && at < cap)
		buf[at++] = '-';
	while (n && at < cap)
		buf[at++] = d[--n];
	return at;
}

static void on_sigsys(int sig, siginfo_t *si, void *uctx)
{
	(void)uctx;
	int saved = errno;
	char name[17] = "?";
	/* The thread's own name (pthread_setname_np wrote it): one prctl, signal-safe. */
	if (prctl(PR_GET_NAME, name, 0, 0, 0) < 0)
		name[0] = '?', name[1] = 0;
	name[16] = 0;
	int nr = si->si_syscall;
	const char *call = nr >= 0 && nr < SYSCALL_NAMES_COUNT && syscall_names[nr]
			       ? syscall_names[nr]
			       : "unknown";
	char line[200];
	size_t n = 0, cap = sizeof(line) - 1;
	n = put(line, n, cap, "cove: error: seccomp: thread ");
	n = put(line, n, cap, name);
	n = put(line, n, cap, " made a forbidden system call: ");
	n = put(line, n, cap, call);
	n = put(line, n, cap, " (");
	n = put_num(line, n, cap, nr);
	n = put(line, n, cap, "); the process ends by SIGSYS\n");
	ssize_t w = write(STDERR_FILENO, line, n);
	(void)w;
	/* Die by the signal itself, not an abort of our own: default action, then re-raise. */
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = SIG_DFL;
	sigaction(sig, &sa, NULL);
	syscall(SYS_tgkill, getpid(), syscall(SYS_gettid), sig);
	errno = saved;
}

int seccomp_trap_init(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sigsys;
	sa.sa_flags = SA_SIGINFO;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGSYS, &sa, NULL) < 0)
		return -errno;
	/* A thread that blocked SIGSYS would be killed without the line: unblock it here. */
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGSYS);
	return -pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}

static int add_ioctls(scmp_filter_ctx ctx, const unsigned long *reqs, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		/* The request is an unsigned int in the kernel: compare its low 32 bits only. */
		int r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(ioctl), 1,
					 SCMP_A1_32(SCMP_CMP_EQ, (uint32_t)reqs[i], 0));
		if (r)
			return r;
	}
	return 0;
}

static int add_arg_rules(scmp_filter_ctx ctx, enum seccomp_kind kind)
{
	int r = 0;
	/* No executable mapping after start, in any thread: no new code enters the process. */
	r = r
		?: seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(mmap), 1,
				    SCMP_A2_64(SCMP_CMP_MASKED_EQ, PROT_EXEC, 0));
	r = r
		?: seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(mprotect), 1,
				    SCMP_A2_64(SCMP_CMP_MASKED_EQ, PROT_EXEC, 0));
	/* The SIGSYS reporter reads the thread's name; the loop names the threads it starts. */
	r = r
		?: seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(prctl), 1,
				    SCMP_A0_32(SCMP_CMP_EQ, PR_GET_NAME, 0));
	switch (kind) {
	case SECCOMP_VCPU:
		r = r ?: add_ioctls(ctx, vcpu_ioctls, sizeof(vcpu_ioctls) / sizeof(vcpu_ioctls[0]));
		break;
	case SECCOMP_UFFD:
		r = r ?: add_ioctls(ctx, uffd_ioctls, sizeof(uffd_ioctls) / sizeof(uffd_ioctls[0]));
		break;
	case SECCOMP_EVLOOP:
		r = r
			?: add_ioctls(ctx, evloop_ioctls,
				      sizeof(evloop_ioctls) / sizeof(evloop_ioctls[0]));
		r = r
			?: seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(prctl), 1,
					    SCMP_A0_32(SCMP_CMP_EQ, PR_SET_NAME, 0));
		/* Unix sockets only: the API, vsock's host side, the agent; never the network. */
		r = r
			?: seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socket), 1,
					    SCMP_A0_32(SCMP_CMP_EQ, AF_UNIX, 0));
		r = r
			?: seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socketpair), 1,
					    SCMP_A0_32(SCMP_CMP_EQ, AF_UNIX, 0));
		/*
		 * Opens: for reading only (no write access mode, no O_CREAT, no O_TRUNC), or a
		 * new file beneath a directory fd (O_CREAT|O_EXCL: an existing file, or a link in
		 * its place, fails). So no thread gets a writable fd to a file it did not create
		 * in this run. Anything else traps: creating by a path (AT_FDCWD), opening an
		 * existing file for writing, O_TMPFILE; open, creat and openat2 are not allowed.
		 */
		r = r
			?: seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(openat), 1,
					    SCMP_A2_32(SCMP_CMP_MASKED_EQ,
						       O_ACCMODE | O_CREAT | O_TRUNC, O_RDONLY));
		r = r
			?: seccomp_rule_add(
			       ctx, SCMP_ACT_ALLOW, SCMP_SYS(openat), 2,
			       SCMP_A0_32(SCMP_CMP_NE, (uint32_t)AT_FDCWD, 0),
			       SCMP_A2_32(SCMP_CMP_MASKED_EQ, O_CREAT | O_EXCL, O_CREAT | O_EXCL));
		/* A commit renames its new file to a name nothing has yet: never over one. */
		r = r
			?: seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(renameat2), 1,
					    SCMP_A4_32(SCMP_CMP_EQ, RENAME_NOREPLACE, 0));
		r = r
			?: seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(renameat2), 1,
					    SCMP_A4_32(SCMP_CMP_NE, RENAME_NOREPLACE, 0));
		/* Threads only: a new process could exec. */
		r = r
			?: seccomp_rule_add(
			       ctx, SCMP_ACT_ALLOW, SCMP_SYS(clone), 1,
			       SCMP_A0_64(SCMP_CMP_MASKED_EQ, CLONE_THREAD, CLONE_THREAD));
		/* Its flags sit in memory seccomp cannot read: ENOSYS sends glibc to clone. */
		r = r ?: seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
		break;
	default:
		return -EINVAL;
	}
	return r;
}

int seccomp_install(enum seccomp_kind kind, char *err, size_t errlen)
{
	if ((unsigned)kind >= SECCOMP_KINDS)
		return errmsg(err, errlen, -EINVAL, "seccomp: unknown thread kind %d", (int)kind);
	scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_TRAP);
	if (!ctx)
		return errmsg(err, errlen, -ENOMEM, "seccomp: cannot build a filter");
	int r = 0;
	unsigned bit = 1u << kind;
	for (size_t i = 0; !r && i < sizeof(plain_calls) / sizeof(plain_calls[0]); i++)
		if (plain_calls[i].kinds & bit)
			r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, plain_calls[i].nr, 0);
	for (size_t i = 0; !r && i < sizeof(refused_file_calls) / sizeof(refused_file_calls[0]);
	     i++)
		r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), refused_file_calls[i], 0);
	if (!r)
		r = add_arg_rules(ctx, kind);
	/* Another architecture's system calls (an int 0x80 from 64-bit code) end the process. */
	if (!r)
		r = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
	if (!r)
		r = seccomp_load(ctx);
	seccomp_release(ctx);
	if (r)
		return errmsg(err, errlen, r < 0 ? r : -EINVAL,
			      "seccomp: cannot install the %s filter: %s", kind_names[kind],
			      strerror(r < 0 ? -r : EINVAL));
	return 0;
}

#ifdef COVE_TEST_HOOKS
void seccomp_test_trigger(enum seccomp_kind kind)
{
	const char *spec = getenv("COVE_TEST_SECCOMP");
	const char *colon = spec ? strchr(spec, ':') : NULL;
	const char *kn = seccomp_kind_name(kind);
	if (!colon || !kn || strlen(kn) != (size_t)(colon - spec) || strncmp(spec, kn, strlen(kn)))
		return;
	const char *call = colon + 1;
	if (!strcmp(call, "execve")) {
		char *const argv[] = {"/bin/true", NULL};
		execve("/bin/true", argv, NULL);
	} else if (!strcmp(call, "socket")) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd >= 0)
			close(fd);
	} else if (!strcmp(call, "open")) {
		int fd =
		    open("/tmp/cove-seccomp-test-new-file", O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
		if (fd >= 0)
			close(fd);
	} else if (!strcmp(call, "mmap")) {
		void *p =
		    mmap(NULL, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p != MAP_FAILED)
			munmap(p, 4096);
	}
}
#else
void seccomp_test_trigger(enum seccomp_kind kind)
{
	(void)kind;
}
#endif
