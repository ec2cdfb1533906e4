/* The jail's cgroup v2 limits: memory.max, cpu.max and pids.max in CGROUP_ROOT/cove/vmm-PID. */
#include "sandbox/jail_cgroup.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "common/file_io.h"

#define CGROUP_ROOT "/sys/fs/cgroup"

/*
 * A jailed VMM cannot remove its own cgroup (it is in it, and has no way back out of its cgroup
 * namespace): the next jail removes every empty vmm-* one left (rmdir fails on a live one).
 */
static void remove_stale_cgroups(void)
{
	int dfd = open(CGROUP_ROOT "/cove", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
	if (!d) {
		if (dfd >= 0)
			close(dfd);
		return;
	}
	for (struct dirent *e; (e = readdir(d));)
		if (!strncmp(e->d_name, "vmm-", 4) && e->d_type == DT_DIR)
			unlinkat(dfd, e->d_name, AT_REMOVEDIR);
	closedir(d);
}

/* cgroup v2 limits in CGROUP_ROOT/cove/vmm-PID, or one line saying why not. */
void jail_cgroup_limits(const struct jail_opts *o, struct logger *log)
{
	struct statfs fs;
	char dir[128], path[192], val[64];
	if (statfs(CGROUP_ROOT, &fs) || fs.f_type != CGROUP2_SUPER_MAGIC ||
	    access(CGROUP_ROOT, W_OK)) {
		/* A warning when limits were asked for; only the default pids.max: a note. */
		bool asked = o->mem_max || o->cpu_max_pct || o->pids_max;
		log_msg(log, asked ? LOG_WARN : LOG_INFO,
			"jail: no writable cgroup v2 hierarchy at " CGROUP_ROOT
			": memory, cpu and pids limits skipped");
		return;
	}
	/* Controllers must be on in every parent's subtree_control; failures show below. */
	file_write_str(CGROUP_ROOT "/cgroup.subtree_control", "+memory +cpu +pids");
	if (mkdir(CGROUP_ROOT "/cove", 0755) && errno != EEXIST)
		goto fail;
	file_write_str(CGROUP_ROOT "/cove/cgroup.subtree_control", "+memory +cpu +pids");
	remove_stale_cgroups();
	snprintf(dir, sizeof(dir), CGROUP_ROOT "/cove/vmm-%d", (int)getpid());
	if (mkdir(dir, 0755) && errno != EEXIST)
		goto fail;
	const char *what = "pids.max";
	snprintf(val, sizeof(val), "%llu",
		 (unsigned long long)(o->pids_max ? o->pids_max : JAIL_DEF_PIDS));
	snprintf(path, sizeof(path), "%s/pids.max", dir);
	int r = file_write_str(path, val);
	if (!r && o->mem_max) {
		what = "memory.max";
		snprintf(val, sizeof(val), "%llu", (unsigned long long)o->mem_max);
		snprintf(path, sizeof(path), "%s/memory.max", dir);
		r = file_write_str(path, val);
	}
	if (!r && o->cpu_max_pct) {
		what = "cpu.max";
		snprintf(val, sizeof(val), "%llu 100000",
			 (unsigned long long)o->cpu_max_pct * 1000);
		snprintf(path, sizeof(path), "%s/cpu.max", dir);
		r = file_write_str(path, val);
	}
	if (!r) {
		what = "cgroup.procs";
		snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
		r = file_write_str(path, "0");
	}
	if (r) {
		log_warn(log, "jail: cgroup %s: %s: limits skipped", what, strerror(-r));
		rmdir(dir);
		return;
	}
	log_info(log, "jail: cgroup %s", dir);
	return;
fail:
	log_warn(log, "jail: cgroup directory under " CGROUP_ROOT "/cove: %s: limits skipped",
		 strerror(errno));
}
