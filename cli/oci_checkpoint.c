/*
 * cove-oci checkpoint and restore (cli/oci.h): a container's checkpoint is a cove snapshot.
 * checkpoint forks the running VM (a pause, a snapshot, a stopped clone; the container goes on),
 * packs the clone's chain (cove archive) and copies the archive into --image-path with a record
 * of the root disk, memory, vCPUs and the process's exec session; podman also wants an
 * inventory.img there. restore makes the container's VM from the implicit template of the same
 * root (found by the bundle's digest, never by a path in the checkpoint), whose chain the
 * checkpoint's replaces (cove create --checkpoint), and its monitor attaches the session: the
 * process goes on with its memory intact. CRIU is never run.
 */
#include "cli/oci.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "common/clock.h"
#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "common/file_io.h"
#include "common/hex.h"
#include "lifecycle/import.h"
#include "lifecycle/root.h"

#define SMALL_MAX 4096 /* cove-oci's own small files: root.json, session */

/* j (taken: freed here; NULL counts as out of memory) written as name in dfd. 0 or -errno. */
static int json_file_write(int dfd, const char *name, json_t *j)
{
	char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
	int fd = text ? dirfd_create(dfd, name, O_WRONLY | O_CLOEXEC, 0600) : -ENOMEM;
	int r = fd < 0 ? fd : pwrite_full(fd, text, strlen(text), 0);
	if (fd >= 0)
		close(fd);
	free(text);
	json_decref(j);
	return r;
}

int oci_root_record(int dfd, const struct oci_ckpt *used)
{
	return json_file_write(dfd, OCI_ROOT_RECORD,
			       json_pack("{s:s,s:I,s:i}", "root", used->root, "mem_bytes",
					 (json_int_t)used->mem_bytes, "vcpus", used->vcpus));
}

/* name in dfd (or an absolute path, dfd AT_FDCWD), at most cap - 1 bytes, into buf. Its length,
 * or -errno (-EFBIG: longer). */
static ssize_t read_small(int dfd, const char *name, char *buf, size_t cap)
{
	int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	ssize_t n = pread(fd, buf, cap, 0);
	int e = errno;
	close(fd);
	if (n < 0)
		return -e;
	if ((size_t)n >= cap)
		return -EFBIG;
	buf[n] = '\0';
	return n;
}

/* The checkpoint's record: the root record written at create, and the session. 0 or -errno with
 * x->err. */
static int record_take(struct oci_ctx *x, int dfd, struct oci_ckpt *c)
{
	char buf[SMALL_MAX], ses[64];
	ssize_t n = read_small(dfd, OCI_ROOT_RECORD, buf, sizeof(buf));
	if (n < 0)
		return errmsg(x->err, sizeof(x->err), (int)n, "its root record: %s",
			      strerror((int)-n));
	json_t *j = json_loadb(buf, (size_t)n, 0, NULL);
	if (!json_is_object(j)) {
		json_decref(j);
		return errmsg(x->err, sizeof(x->err), -EINVAL,
			      "its root record is not a JSON object");
	}
	ssize_t m = read_small(dfd, OCI_SESSION, ses, sizeof(ses));
	if (m < 0) {
		json_decref(j);
		return errmsg(
		    x->err, sizeof(x->err), (int)m,
		    "its process's exec session is not known (%s): a container made by an "
		    "older cove-oci cannot be checkpointed",
		    strerror((int)-m));
	}
	ses[strcspn(ses, "\n")] = '\0';
	json_object_set_new(j, "session", json_string(ses));
	json_object_set_new(j, "cove_checkpoint", json_integer(OCI_CKPT_VERSION));
	json_object_set_new(j, "created_ms", json_integer(realtime_ms()));
	char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
	int r = text ? oci_ckpt_parse(text, strlen(text), c, x->err, sizeof(x->err)) : -ENOMEM;
	free(text);
	json_decref(j);
	return r;
}

/* The fork's archive copied into D/cove/archive, the record beside it, inventory.img in D. */
static int write_checkpoint(struct oci_ctx *x, const char *image_path, const char *fork,
			    const struct oci_ckpt *c)
{
	char dir[PATH_MAX + 64], arc[PATH_MAX + 128], err[512];
	struct sbx_root r = {.dfd = -1};
	int r_ = 0, sdfd = -1;
	if (mkdir(image_path, 0700) < 0 && errno != EEXIST)
		return errmsg(x->err, sizeof(x->err), -errno, "--image-path %s: %s", image_path,
			      strerror(errno));
	snprintf(dir, sizeof(dir), "%s/%s", image_path, OCI_CKPT_DIR);
	snprintf(arc, sizeof(arc), "%s/%s", dir, OCI_CKPT_ARCHIVE);
	if (mkdir(dir, 0700) < 0)
		return errmsg(x->err, sizeof(x->err), -errno, "%s: %s", dir, strerror(errno));
	if (sbx_root_open(&r, false, err, sizeof(err)) ||
	    (sdfd = sbx_dir_open(&r, fork, false, err, sizeof(err))) < 0 ||
	    sbx_archive_copy_out(sdfd, arc, err, sizeof(err)))
		r_ = errmsg(x->err, sizeof(x->err), -EIO, "%s", err);
	if (sdfd >= 0)
		close(sdfd);
	sbx_root_close(&r);
	if (r_)
		return r_;
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), fd;
	r_ = dfd < 0 ? -errno : json_file_write(dfd, OCI_CKPT_RECORD, oci_ckpt_json(c));
	if (dfd >= 0)
		close(dfd);
	/* podman looks for CRIU's inventory.img before it restores; cove's is empty. */
	snprintf(dir, sizeof(dir), "%s/inventory.img", image_path);
	if (!r_ &&
	    (fd = open(dir, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600)) >= 0)
		close(fd);
	else if (!r_)
		r_ = -errno;
	if (r_)
		return errmsg(x->err, sizeof(x->err), r_, "writing the checkpoint in %s: %s",
			      image_path, strerror(-r_));
	return 0;
}

static void checkpoint_usage(FILE *out)
{
	fputs(
	    "usage: cove-oci checkpoint --image-path DIR [--work-path DIR] [--leave-running] ID\n"
	    "A cove snapshot of the container's VM (no CRIU): its chain packed into DIR/cove/\n"
	    "with a record of its root, memory, vCPUs and process; DIR/inventory.img for podman.\n"
	    "Without --leave-running the container ends once it is written. CRIU's other\n"
	    "options are accepted and have nothing to do in a VM.\n",
	    out);
}

int oci_cmd_checkpoint(struct oci_ctx *x, int argc, char **argv)
{
	enum { O_IMAGE = 256, O_WORK, O_LEAVE, O_PARENT, O_MODE, O_NS, O_FD, O_SERVER, O_FLAG };
	static const struct option opts[] = {
	    {"image-path", required_argument, NULL, O_IMAGE},
	    {"work-path", required_argument, NULL, O_WORK},
	    {"leave-running", no_argument, NULL, O_LEAVE},
	    {"parent-path", required_argument, NULL, O_PARENT},
	    {"manage-cgroups-mode", required_argument, NULL, O_MODE},
	    {"empty-ns", required_argument, NULL, O_NS},
	    {"status-fd", required_argument, NULL, O_FD},
	    {"page-server", required_argument, NULL, O_SERVER},
	    {"tcp-established", no_argument, NULL, O_FLAG},
	    {"ext-unix-sk", no_argument, NULL, O_FLAG},
	    {"shell-job", no_argument, NULL, O_FLAG},
	    {"file-locks", no_argument, NULL, O_FLAG},
	    {"pre-dump", no_argument, NULL, O_FLAG},
	    {"lazy-pages", no_argument, NULL, O_FLAG},
	    {"auto-dedup", no_argument, NULL, O_FLAG},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	const char *image_path = NULL;
	bool leave = false;
	int c;
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		if (c == 'h') { /* podman's probe: a runtime that answers can checkpoint */
			checkpoint_usage(stdout);
			return 0;
		} else if (c == O_IMAGE) {
			image_path = optarg;
		} else if (c == O_LEAVE) {
			leave = true;
		} else if (c == O_PARENT || c == O_SERVER) {
			return oci_fail(x,
					"checkpoint: %s: cove checkpoints are whole (no pre-dump "
					"chains or page servers)",
					argv[optind - 1]);
		} else if (c == '?') {
			return oci_fail(x, "checkpoint: unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind != argc - 1)
		return oci_fail(x, "checkpoint: want one container id");
	if (!image_path)
		return oci_fail(x, "checkpoint: --image-path is required");
	const char *id = argv[optind];
	struct oci_state s;
	struct oci_ckpt rec;
	int dfd = oci_state_dir(x->root, id, false, x->err, sizeof(x->err)), st = 1;
	if (dfd < 0)
		return oci_fail(x, "checkpoint: %s", x->err);
	if (oci_state_read(dfd, &s, x->err, sizeof(x->err))) {
		close(dfd);
		return oci_fail(x, "checkpoint %s: %s", id, x->err);
	}
	oci_state_env_apply(&s);
	const char *status = oci_status(dfd, &s);
	double t0 = mono_s();
	if (s.holder) {
		oci_fail(x, "checkpoint %s: a pod's own container has no VM", id);
		goto out;
	}
	if (strcmp(status, "running") && strcmp(status, "paused")) {
		oci_fail(x, "checkpoint %s: the container is %s", id, status);
		goto out;
	}
	if (record_take(x, dfd, &rec)) {
		oci_fail(x, "checkpoint %s: %s", id, x->err);
		goto out;
	}
	/* A stopped clone of the running VM (cove fork pauses it for the snapshot), packed. */
	unsigned char rnd[8];
	char fork[32];
	if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
		oci_fail(x, "checkpoint %s: no randomness", id);
		goto out;
	}
	memcpy(fork, "ock-", 4);
	hex_encode(rnd, sizeof(rnd), fork + 4);
	const char *fork_argv[] = {"cove", "fork", s.sandbox, fork, NULL};
	const char *arch_argv[] = {"cove", "archive", fork, NULL};
	const char *pause_argv[] = {"cove", "pause", s.sandbox, NULL};
	const char *resume_argv[] = {"cove", "resume", s.sandbox, NULL};
	/* A container that ends with its checkpoint stops at the snapshot, as under CRIU: it is
	 * paused first and never runs past what the checkpoint holds. */
	bool paused = !leave && !strcmp(status, "running");
	if (paused && oci_cove(x, pause_argv)) {
		oci_fail(x, "checkpoint %s: cove pause: %s", id, x->err);
		goto out;
	}
	if (oci_cove(x, fork_argv)) {
		oci_fail(x, "checkpoint %s: cove fork: %s", id, x->err);
		if (paused)
			oci_cove(x, resume_argv);
		goto out;
	}
	double t_fork = mono_s();
	if (oci_cove(x, arch_argv) || write_checkpoint(x, image_path, fork, &rec)) {
		oci_fail(x, "checkpoint %s: %s", id, x->err);
		oci_sandbox_rm(x, fork);
		if (paused)
			oci_cove(x, resume_argv);
		goto out;
	}
	oci_sandbox_rm(x, fork);
	log_info(x->log, "%s: checkpoint written to %s in %.0f ms (fork %.0f ms)%s", id, image_path,
		 (mono_s() - t0) * 1000, (t_fork - t0) * 1000,
		 leave ? "; it runs on" : "; the container ends");
	if (!leave)
		oci_container_end(x, dfd, &s);
	st = 0;
out:
	oci_state_free(&s);
	close(dfd);
	return st;
}

/* D/cove/checkpoint.json read and checked into rs, with the archive's path. 0 or -errno. */
static int restore_take(struct oci_ctx *x, const char *image_path, struct oci_restore *rs)
{
	char path[PATH_MAX + 64];
	char *buf = malloc(OCI_CKPT_MAX + 1);
	if (!buf)
		return errmsg(x->err, sizeof(x->err), -ENOMEM, "out of memory");
	snprintf(path, sizeof(path), "%s/%s/%s", image_path, OCI_CKPT_DIR, OCI_CKPT_RECORD);
	ssize_t n = read_small(AT_FDCWD, path, buf, OCI_CKPT_MAX + 1);
	int r = n < 0 ? errmsg(x->err, sizeof(x->err), (int)n, "%s: %s", path,
			       n == -EFBIG ? "larger than the cap" : strerror((int)-n))
		      : oci_ckpt_parse(buf, (size_t)n, &rs->rec, x->err, sizeof(x->err));
	free(buf);
	snprintf(rs->archive, sizeof(rs->archive), "%s/%s/%s", image_path, OCI_CKPT_DIR,
		 OCI_CKPT_ARCHIVE);
	return r;
}

int oci_cmd_restore(struct oci_ctx *x, int argc, char **argv)
{
	enum { O_IMAGE = 256, O_BUNDLE, O_PID, O_CONSOLE, O_ARG, O_FLAG };
	static const struct option opts[] = {
	    {"image-path", required_argument, NULL, O_IMAGE},
	    {"bundle", required_argument, NULL, O_BUNDLE},
	    {"pid-file", required_argument, NULL, O_PID},
	    {"console-socket", required_argument, NULL, O_CONSOLE},
	    {"work-path", required_argument, NULL, O_ARG},
	    {"manage-cgroups-mode", required_argument, NULL, O_ARG},
	    {"empty-ns", required_argument, NULL, O_ARG},
	    {"lsm-profile", required_argument, NULL, O_ARG},
	    {"lsm-mount-context", required_argument, NULL, O_ARG},
	    {"detach", no_argument, NULL, O_FLAG},
	    {"no-subreaper", no_argument, NULL, O_FLAG},
	    {"no-pivot", no_argument, NULL, O_FLAG},
	    {"tcp-established", no_argument, NULL, O_FLAG},
	    {"ext-unix-sk", no_argument, NULL, O_FLAG},
	    {"shell-job", no_argument, NULL, O_FLAG},
	    {"file-locks", no_argument, NULL, O_FLAG},
	    {"lazy-pages", no_argument, NULL, O_FLAG},
	    {"auto-dedup", no_argument, NULL, O_FLAG},
	    {NULL, 0, NULL, 0},
	};
	const char *image_path = NULL, *bundle = ".", *pid_file = NULL, *console = NULL;
	int c;
	/* containerd passes -no-subreaper with one dash. */
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "-no-subreaper"))
			argv[i] = "--no-subreaper";
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "b:d", opts, NULL)) != -1) {
		if (c == O_IMAGE)
			image_path = optarg;
		else if (c == O_BUNDLE || c == 'b')
			bundle = optarg;
		else if (c == O_PID)
			pid_file = optarg;
		else if (c == O_CONSOLE)
			console = optarg;
		else if (c == '?')
			return oci_fail(x, "restore: unknown option '%s'", argv[optind - 1]);
	}
	if (optind != argc - 1)
		return oci_fail(x, "restore: want one container id");
	if (!image_path)
		return oci_fail(x, "restore: --image-path is required");
	struct oci_restore *rs = calloc(1, sizeof(*rs));
	if (!rs)
		return oci_fail(x, "restore: out of memory");
	int st = restore_take(x, image_path, rs)
		     ? oci_fail(x, "restore %s: %s", argv[optind], x->err)
		     : oci_container_make(x, argv[optind], bundle, pid_file, console, rs);
	free(rs);
	return st;
}
