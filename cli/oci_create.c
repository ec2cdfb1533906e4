/* cove-oci create and start (cli/oci.h). */
#include "cli/oci.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "common/file_io.h"
#include "lifecycle/tree.h"
#include "oci/host_conf.h"

static void now_rfc3339(char *out, size_t cap)
{
	struct timespec ts;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	size_t n = strftime(out, cap, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(out + n, cap - n, ".%09ldZ", ts.tv_nsec);
}

/* The sandbox: cove create --image (the bundle's root as a cached disk, or cove.dev/image); a
 * restore's with --checkpoint, its root the one the checkpoint was taken on. The root's name, the
 * memory and vCPUs it got go into *used (what a later checkpoint records). */
static int make_sandbox(struct oci_ctx *x, const struct oci_bundle *b, const char *sandbox,
			const struct oci_restore *rs, struct oci_ckpt *used)
{
	char ref[256], mem[32], cpus[16];
	const char *argv[22];
	int k = 0, r;
	if (b->image[0])
		snprintf(ref, sizeof(ref), "%s", b->image);
	else if ((r = oci_disk_build(x, b, sandbox, ref, sizeof(ref))))
		return r;
	if (rs && strcmp(ref, rs->rec.root))
		return errmsg(x->err, sizeof(x->err), -EINVAL,
			      "the bundle's root is %s, the checkpoint was taken on %s", ref,
			      rs->rec.root);
	used->mem_bytes = rs		 ? rs->rec.mem_bytes
			  : b->mem_bytes ? b->mem_bytes
					 : OCI_HOST_SANDBOX_MEM_DEFAULT;
	used->vcpus = rs ? rs->rec.vcpus : b->vcpus ? b->vcpus : 1;
	if (rs && ((b->mem_bytes && b->mem_bytes != rs->rec.mem_bytes) ||
		   (b->vcpus && b->vcpus != rs->rec.vcpus)))
		return errmsg(x->err, sizeof(x->err), -EINVAL,
			      "the bundle asks for %llu bytes and %d vCPUs, the checkpoint's VM "
			      "had %llu and %d",
			      (unsigned long long)b->mem_bytes, b->vcpus,
			      (unsigned long long)rs->rec.mem_bytes, rs->rec.vcpus);
	snprintf(used->root, sizeof(used->root), "%s", ref);
	argv[k++] = "cove";
	argv[k++] = "create";
	argv[k++] = sandbox;
	argv[k++] = "--image";
	argv[k++] = ref;
	argv[k++] = "--snapshot-every";
	argv[k++] = "off";
	/* Warm either way: the image's implicit template, or the root's (its disk is kept by
	 * digest), is built by the first container and restored by every later one. */
	if (rs || b->mem_bytes) {
		snprintf(mem, sizeof(mem), "%lluK", (unsigned long long)(used->mem_bytes >> 10));
		argv[k++] = "--mem";
		argv[k++] = mem;
	}
	if (rs || b->vcpus) {
		snprintf(cpus, sizeof(cpus), "%d", used->vcpus);
		argv[k++] = "--vcpus";
		argv[k++] = cpus;
	}
	if (b->policy_file[0]) { /* cove.dev/policy, from the host's set */
		argv[k++] = "--policy";
		argv[k++] = b->policy_file;
	}
	if (rs) {
		argv[k++] = "--checkpoint";
		argv[k++] = rs->archive;
	}
	argv[k] = NULL;
	double t0 = mono_s();
	r = oci_cove(x, argv);
	log_info(x->log, "%s: cove create%s %s in %.0f ms", sandbox, rs ? " --checkpoint" : "",
		 r ? "failed" : "done", (mono_s() - t0) * 1000);
	if (r) {
		char why[sizeof(x->err)];
		snprintf(why, sizeof(why), "%s", x->err);
		return errmsg(x->err, sizeof(x->err), r < 0 ? r : -EIO, "cove create %s: %s",
			      sandbox, why);
	}
	return 0;
}

/* The annotations against this host's caps and policies (oci/host_conf.h). 0 or -errno. */
static int host_caps(struct oci_ctx *x, struct oci_bundle *b)
{
	struct oci_host_conf c;
	int r = oci_host_conf_load(NULL, &c, x->err, sizeof(x->err));
	if (!r)
		r = oci_host_conf_apply(&c, b, x->err, sizeof(x->err));
	x->max_root_disks = c.max_root_disks;
	oci_host_conf_free(&c);
	return r;
}

int oci_cmd_create(struct oci_ctx *x, int argc, char **argv)
{
	static const struct option opts[] = {
	    {"bundle", required_argument, NULL, 'b'},
	    {"pid-file", required_argument, NULL, 'p'},
	    {"console-socket", required_argument, NULL, 'c'},
	    {"no-pivot", no_argument, NULL, 'n'},
	    {"no-new-keyring", no_argument, NULL, 'k'},
	    {"preserve-fds", required_argument, NULL, 'f'},
	    {NULL, 0, NULL, 0},
	};
	const char *bundle = ".", *pid_file = NULL, *console = NULL;
	int c;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "b:", opts, NULL)) != -1) {
		if (c == 'b')
			bundle = optarg;
		else if (c == 'p')
			pid_file = optarg;
		else if (c == 'c')
			console = optarg;
		else if (c == '?')
			return oci_fail(x, "create: unknown option '%s'", argv[optind - 1]);
	}
	if (optind != argc - 1)
		return oci_fail(x, "create: want one container id");
	return oci_container_make(x, argv[optind], bundle, pid_file, console, NULL);
}

int oci_container_make(struct oci_ctx *x, const char *id, const char *bundle, const char *pid_file,
		       const char *console, const struct oci_restore *rs)
{
	const char *what = rs ? "restore" : "create";
	struct oci_bundle b;
	struct oci_state s = {0};
	struct oci_ckpt used = {0};
	char session_path[PATH_MAX + 200];
	int dfd = -1, fifo = -1, tty = -1, st = 1;
	double t0 = mono_s(), t_sbx, t_vm, t_guest;
	if (oci_bundle_load(bundle, &b, x->err, sizeof(x->err)))
		return oci_fail(x, "%s %s: %s", what, id, x->err);
	if (host_caps(x, &b)) {
		oci_bundle_free(&b);
		return oci_fail(x, "%s %s: %s", what, id, x->err);
	}
	dfd = oci_state_dir(x->root, id, true, x->err, sizeof(x->err));
	if (dfd < 0) {
		oci_bundle_free(&b);
		return oci_fail(x, "%s: %s", what, x->err);
	}
	snprintf(s.id, sizeof(s.id), "%s", id);
	snprintf(s.bundle, sizeof(s.bundle), "%s", b.dir);
	snprintf(s.rootfs, sizeof(s.rootfs), "%s", b.rootfs);
	now_rfc3339(s.created, sizeof(s.created));
	s.annotations = json_incref(b.annotations);
	s.holder = b.holder;
	oci_state_env_take(&s);
	if (oci_sandbox_name(x->root, id, s.sandbox, sizeof(s.sandbox)) ||
	    oci_state_write(dfd, &s)) {
		oci_fail(x, "%s %s: cannot write its state", what, id);
		goto undo;
	}
	if (b.process.terminal && (tty = oci_console(x, console)) < 0) {
		oci_fail(x, "%s %s: %s", what, id, x->err);
		goto undo;
	}
	t_sbx = mono_s();
	if (rs && b.holder) {
		oci_fail(x, "restore %s: a pod's own container has no VM to restore", id);
		goto undo;
	}
	if (!b.holder && make_sandbox(x, &b, s.sandbox, rs, &used)) {
		oci_fail(x, "%s %s: %s", what, id, x->err);
		goto undo;
	}
	t_vm = mono_s();
	/* A restored guest has its mounts and copied files already (they are in its memory and
	 * disk); its hostname is the identity event's until it is set again. */
	if (!b.holder &&
	    (oci_hostname_apply(x, s.sandbox, &b) || (!rs && oci_mounts_apply(x, s.sandbox, &b)) ||
	     oci_root_record(dfd, &used))) {
		oci_fail(x, "%s %s: %s", what, id, x->err);
		goto undo_vm;
	}
	t_guest = mono_s();
	/* The start fifo, held open both ways by the monitor: `start` writes one byte. A restore
	 * leaves the container running: no start follows. */
	if (!rs && (mkfifoat(dfd, OCI_START_FIFO, 0600) < 0 ||
		    (fifo = openat(dfd, OCI_START_FIFO, O_RDWR | O_NONBLOCK | O_CLOEXEC)) < 0)) {
		oci_fail(x, "create %s: start fifo: %s", id, strerror(errno));
		goto undo_vm;
	}
	if (rs) {
		int m = dirfd_create(dfd, OCI_STARTED, O_WRONLY | O_CLOEXEC, 0600);
		if (m < 0) {
			oci_fail(x, "restore %s: %s", id, strerror(-m));
			goto undo_vm;
		}
		close(m);
	}
	snprintf(session_path, sizeof(session_path), "%s/%s/%s", x->root, id, OCI_SESSION);
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		oci_fail(x, "%s %s: fork: %s", what, id, strerror(errno));
		goto undo_vm;
	}
	if (pid == 0) {
		oci_console_take(tty);
		struct oci_monitor_how how = {.sandbox = b.holder ? NULL : s.sandbox,
					      .session_file = session_path,
					      .attach = rs ? rs->rec.session : NULL,
					      .end_vm = !b.holder};
		oci_monitor(x, dfd, fifo, &how, &b.process);
	}
	close(fifo);
	fifo = -1;
	s.pid = pid;
	s.pid_start = oci_proc_start(pid);
	if (oci_state_write(dfd, &s) || (pid_file && oci_pid_file(pid_file, pid))) {
		oci_fail(x, "%s %s: cannot write its pid file or state", what, id);
		kill(pid, SIGKILL);
		goto undo_vm;
	}
	log_info(x->log,
		 "%s: %s (sandbox %s, monitor %d) in %.0f ms: bundle %.0f, disk and sandbox "
		 "%.0f, hostname and mounts %.0f",
		 id, rs ? "restored" : "created", s.sandbox, (int)pid, (mono_s() - t0) * 1000,
		 (t_sbx - t0) * 1000, (t_vm - t_sbx) * 1000, (t_guest - t_vm) * 1000);
	st = 0;
	goto out;
undo_vm:
	if (!b.holder)
		oci_sandbox_rm(x, s.sandbox);
undo : {
	int rfd = open(x->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (rfd >= 0) {
		sbx_tree_remove(rfd, id);
		close(rfd);
	}
}
out:
	if (fifo >= 0)
		close(fifo);
	if (tty >= 0)
		close(tty);
	close(dfd);
	oci_state_free(&s);
	oci_bundle_free(&b);
	return st;
}

int oci_cmd_start(struct oci_ctx *x, int argc, char **argv)
{
	struct oci_state s;
	if (argc != 2)
		return oci_fail(x, "start: want one container id");
	int dfd = oci_state_dir(x->root, argv[1], false, x->err, sizeof(x->err));
	if (dfd < 0)
		return oci_fail(x, "start: %s", x->err);
	int st = 1;
	if (oci_state_read(dfd, &s, x->err, sizeof(x->err))) {
		oci_fail(x, "start %s: %s", argv[1], x->err);
		goto out;
	}
	const char *status = oci_status(dfd, &s);
	if (strcmp(status, "created")) {
		oci_fail(x, "start %s: the container is %s, not created", argv[1], status);
		goto out_s;
	}
	/* The marker first: once start returns, state says running. */
	int m = dirfd_create(dfd, OCI_STARTED, O_WRONLY | O_CLOEXEC, 0600);
	if (m >= 0)
		close(m);
	int fifo = openat(dfd, OCI_START_FIFO, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
	if (fifo < 0 || write(fifo, "s", 1) != 1) {
		unlinkat(dfd, OCI_STARTED, 0);
		oci_fail(x, "start %s: the monitor is gone: %s", argv[1], strerror(errno));
	} else {
		st = 0;
	}
	if (fifo >= 0)
		close(fifo);
out_s:
	oci_state_free(&s);
out:
	close(dfd);
	return st;
}
