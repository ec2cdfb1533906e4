/* Building a template: one boot, the setup command, quiet, a stopped save. */
#include "cli/template_build.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/create_image.h"
#include "cli/policy_opt.h"
#include "cli/sandbox_stop.h"
#include "cli/sandbox_up.h"
#include "common/clock.h"
#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "lifecycle/chain_check.h"
#include "lifecycle/launch.h"
#include "lifecycle/lock.h"
#include "lifecycle/state.h"
#include "lifecycle/tree.h"
#include "sandbox/agent_client.h"

/* How long the guest may stay busy after the setup command before it is saved anyway. */
#define QUIET_WAIT_S 30
/* Quiet: the VMM used at most this share of a CPU over one sampling window. */
#define QUIET_WINDOW_MS 500
#define QUIET_MAX_PCT	10

/* argv run in the guest as root, its output streamed to ours: its status, or -errno. */
static int guest_run(const char *uds, const char *const *argv, char *err, size_t errlen)
{
	json_t *args = json_array(), *req, *reply = NULL;
	int fd, ret;

	for (int i = 0; argv[i]; i++)
		json_array_append_new(args, json_string(argv[i]));
	req = json_pack("{s:s,s:o,s:[],s:b,s:b}", "op", "exec", "argv", args, "env", "tty", 0,
			"stdin", 0);
	if (!req)
		return errmsg(err, errlen, -EINVAL, "the command is not UTF-8");
	fd = agent_call(uds, 10, req, &reply, err, errlen);
	json_decref(req);
	json_decref(reply);
	if (fd < 0)
		return fd;
	ret = agent_session_stream(fd, false, false, err, errlen);
	close(fd);
	return ret;
}

/* utime + stime (clock ticks) of pid and its children (a jailed VMM is the waiter's child). */
static long long cpu_ticks(pid_t pid)
{
	char path[64], buf[1024];
	long long sum = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)pid, (int)pid);
	f = fopen(path, "re");
	if (f) {
		int kid;

		while (fscanf(f, "%d", &kid) == 1)
			sum += cpu_ticks(kid);
		fclose(f);
	}
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return sum;
	if (fgets(buf, sizeof(buf), f)) {
		char *p = strrchr(buf, ')');
		unsigned long long ut, st;

		/* after "pid (comm)": state ppid pgrp session tty tpgid flags minflt cminflt
		 * majflt cmajflt utime stime */
		if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
				&st) == 2)
			sum += (long long)(ut + st);
	}
	fclose(f);
	return sum;
}

/* Waits until the VMM used at most QUIET_MAX_PCT of a CPU over a window: 0, or -ETIMEDOUT. */
static int wait_quiet(int dfd)
{
	long hz = sysconf(_SC_CLK_TCK);
	double deadline = mono_s() + QUIET_WAIT_S;
	pid_t pid = sbx_vmm_pid(dfd);

	if (pid <= 0 || hz <= 0)
		return 0;
	for (long long before = cpu_ticks(pid); mono_s() < deadline;) {
		usleep(QUIET_WINDOW_MS * 1000);
		long long now = cpu_ticks(pid);

		if ((now - before) * 1000 * 100 <= (long long)hz * QUIET_WINDOW_MS * QUIET_MAX_PCT)
			return 0;
		before = now;
	}
	return -ETIMEDOUT;
}

/* RUN/.t/NAME: the sockets of a template's build. */
void tpl_run_dir_remove(const struct sbx_root *t, const char *name)
{
	int rfd = open(t->run, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (rfd >= 0) {
		sbx_tree_remove(rfd, name);
		close(rfd);
	}
}

/* A build that did not finish: its VMM ended, its files removed. */
static void build_undo(const struct sbx_root *t, const char *name, int dfd)
{
	sbx_vmm_end(dfd, SIGKILL);
	sbx_tree_remove(t->dfd, name);
	tpl_run_dir_remove(t, name);
}

/* Boots, runs the setup command, waits for quiet, stops. 0, or the exit status after a line. */
static int build(const struct sbx_root *t, const char *name, int dfd, const char *run,
		 const char *who)
{
	char err[600], uds[128], api[128];
	enum sbx_state state = SBX_RUNNING;
	int ret, lk;

	if (sbx_start(t, name, dfd, who, err, sizeof(err))) {
		fprintf(stderr, "%s: %s: %s\n", who, name, err);
		return 1;
	}
	sbx_run_path(t, name, "vsock.sock", uds, sizeof(uds));
	sbx_run_path(t, name, "api.sock", api, sizeof(api));
	if (run) {
		const char *argv[] = {"/bin/sh", "-c", run, NULL};

		ret = guest_run(uds, argv, err, sizeof(err));
		if (ret) {
			if (ret < 0)
				fprintf(stderr, "%s: %s: --run: %s\n", who, name, err);
			else
				fprintf(stderr,
					"%s: %s: the setup command exited %d: "
					"nothing saved\n",
					who, name, ret);
			return 1;
		}
	}
	/* The guest's page cache onto its disks, so the final snapshot holds settled files:
	 * cove-init's own sync, as an image may have no sync(1). */
	json_t *req = json_pack("{s:s}", "op", "sync"), *reply = NULL;
	ret = req ? agent_call(uds, 10, req, &reply, err, sizeof(err)) : -ENOMEM;
	json_decref(req);
	json_decref(reply);
	if (ret < 0) {
		fprintf(stderr, "%s: %s: sync in the guest: %s\n", who, name,
			ret == -ENOMEM ? "out of memory" : err);
		return 1;
	}
	close(ret);
	if (wait_quiet(dfd))
		fprintf(stderr,
			"%s: %s: warning: the guest was still busy after %d s; "
			"saved as it is\n",
			who, name, QUIET_WAIT_S);
	lk = sbx_lock_take(dfd, SBX_LOCK_START, true, false);
	ret = sbx_stop_locked(t, name, dfd, api, &state, "template create", who, err, sizeof(err));
	if (lk >= 0)
		close(lk);
	if (ret) {
		fprintf(stderr, "%s: %s: %s\n", who, name, err);
		return 1;
	}
	return 0;
}

int tpl_build(const struct sbx_root *r, const struct sbx_root *t, const char *name,
	      struct sbx_spec *s, const char *run, const char *policy, size_t policy_len,
	      json_t *image, const char *who, struct tpl_meta *m)
{
	char err[600], dir[PATH_MAX];
	int ret, dfd, status;
	double t0 = mono_s();

	/* Only the final snapshot: the setup's intermediate states are of no use to anyone. */
	s->snapshot_every_ms = 0;
	s->idle_stop_ms = s->archive_after_ms = s->delete_after_ms = 0;
	s->created_ms = realtime_ms();
	if (sbx_spec_new_machine_id(s)) {
		fprintf(stderr, "%s: no randomness for a machine id\n", who);
		return 1;
	}
	dfd = sbx_dir_open(t, name, true, err, sizeof(err));
	if (dfd < 0) {
		if (dfd == -EEXIST)
			fprintf(stderr,
				"%s: template %s exists already (cove template rm it first)\n", who,
				name);
		else
			fprintf(stderr, "%s: %s\n", who, err);
		return dfd == -EEXIST ? SBX_EXIT_EXISTS : 1;
	}
	status = 1;
	if (policy && policy_keep(t, name, dfd, s, policy, policy_len, err, sizeof(err))) {
		fprintf(stderr, "%s: %s: %s\n", who, name, err);
		goto undo;
	}
	/* An image's ext4 linked into the template (disk 0 then names the link), and its record. */
	if (image && ((size_t)snprintf(dir, sizeof(dir), "%s/%s", t->state, name) >= sizeof(dir) ||
		      create_image_keep(dfd, s, dir, image, err, sizeof(err)))) {
		fprintf(stderr, "%s: %s: %s\n", who, name, err);
		goto undo;
	}
	ret = sbx_spec_write(dfd, s);
	if (ret) {
		fprintf(stderr, "%s: %s: cannot write its spec: %s\n", who, name, strerror(-ret));
		goto undo;
	}
	/* RUN itself: the build's sockets go in RUN/.t/T, which sbx_start makes. */
	ret = dirfd_open_dir(r->run, true, err, sizeof(err));
	if (ret < 0) {
		fprintf(stderr, "%s: %s\n", who, err);
		goto undo;
	}
	close(ret);
	if (build(t, name, dfd, run, who))
		goto undo;
	/* Its VMM and jail have exited: nothing can write its files any more. */
	ret = sbx_chain_stamps_freeze(t, name, err, sizeof(err));
	if (ret) {
		fprintf(stderr, "%s: %s\n", who, err);
		goto undo;
	}
	memset(m, 0, sizeof(*m));
	snprintf(m->name, sizeof(m->name), "%s", name);
	snprintf(m->run, sizeof(m->run), "%s", run ? run : "");
	m->created_ms = realtime_ms();
	m->build_ms = (uint64_t)((mono_s() - t0) * 1000);
	ret = tpl_meta_write(dfd, m);
	if (ret) {
		fprintf(stderr, "%s: %s: cannot write %s: %s\n", who, name, TPL_META,
			strerror(-ret));
		goto undo;
	}
	tpl_run_dir_remove(t, name);
	close(dfd);
	return 0;
undo:
	build_undo(t, name, dfd);
	close(dfd);
	return status;
}
