/* Building the argv of `cove run` / `cove restore` for a sandbox. */
#include "lifecycle/vmm_args.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "lifecycle/broker.h"
#include "lifecycle/launch.h"
#include "lifecycle/policy.h"
#include "sandbox/options.h"

static int add(struct sbx_args *a, const char *fmt, ...)
{
	size_t room = sizeof(a->arena) - a->used;
	va_list ap;
	int n;

	if (a->argc >= SBX_ARGS_MAX)
		return -E2BIG;
	va_start(ap, fmt);
	n = vsnprintf(a->arena + a->used, room, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= room)
		return -E2BIG;
	a->argv[a->argc++] = a->arena + a->used;
	a->argv[a->argc] = NULL;
	a->used += (size_t)n + 1;
	return 0;
}

/* What run and restore share: sockets, console, chain, snapshots, key. */
static int common_args(struct sbx_args *a, const struct sbx_root *r, const char *name,
		       const struct sbx_spec *s)
{
	int ret = add(a, "--vsock-cid") ?: add(a, "%d", SBX_VSOCK_CID) ?: add(a, "--vsock-uds") ?:
		  add(a, "%s/%s/vsock.sock", r->run, name) ?: add(a, "--api-sock") ?:
		  add(a, "%s/%s/api.sock", r->run, name) ?: add(a, "--console") ?:
		  add(a, "%s/%s/%s", r->state, name, SBX_CONSOLE) ?: add(a, "--snapshot-dir") ?:
		  add(a, "%s/%s/%s", r->state, name, SBX_CHAIN);

	if (!ret && s->snapshot_every_ms)
		ret = add(a, "--snapshot-interval")
			  ?: add(a, "%llums", (unsigned long long)s->snapshot_every_ms);
	if (!ret && s->vsock_rate)
		ret = add(a, "--vsock-rate") ?: add(a, "%llu", (unsigned long long)s->vsock_rate);
	/* Every start and restore: the spec asked for it at create (it warns in the log). */
	if (!ret && s->no_seccomp)
		ret = add(a, "--no-seccomp");
	/* Jailed as the sandbox's owner (root: in namespaces, without a capability); the life
	 * lock is the one inherited fd it keeps (lifecycle/launch.c moves it to SBX_LOCK_FD). */
	if (!ret && !s->no_jail)
		ret = add(a, "--jail") ?: add(a, "%s/%s/%s", r->state, name, SBX_JAIL_DIR) ?:
		      add(a, "--uid") ?: add(a, "%u", (unsigned)geteuid()) ?: add(a, "--gid") ?:
		      add(a, "%u", (unsigned)getegid()) ?: add(a, "--jail-keep-fd") ?:
		      add(a, "%d", SBX_LOCK_FD);
	/* cove-broker's files beside the VMM's: shown empty in its jail (broker_jail.h). */
	static const char *const broker_files[] = {SBX_POLICY,	     SBX_POLICY ".audit-key",
						   SBX_BROKER_AUDIT, SBX_BROKER_LOG,
						   SBX_BROKER_EPOCH, SBX_BROKER_MITM_CA};
	if (!ret && !s->no_jail)
		ret = add(a, "--jail-hide") ?: add(a, "%s/%s/%s", r->run, name, SBX_BROKER_CTL_DIR);
	for (size_t i = 0; !ret && !s->no_jail && i < sizeof(broker_files) / sizeof(*broker_files);
	     i++)
		ret = add(a, "--jail-hide") ?: add(a, "%s/%s/%s", r->state, name, broker_files[i]);
	/* It leaves a note in its chain; the host records the stop (lifecycle/state.c). */
	if (!ret && s->idle_stop_ms)
		ret =
		    add(a, "--idle-stop") ?: add(a, "%llums", (unsigned long long)s->idle_stop_ms);
	return ret;
}

int sbx_args_append(struct sbx_args *a, const char *arg)
{
	return add(a, "%s", arg);
}

int sbx_args_run(struct sbx_args *a, const struct sbx_root *r, const char *name,
		 const struct sbx_spec *s)
{
	int ret;

	memset(a, 0, sizeof(*a));
	ret = add(a, "cove") ?: add(a, "run") ?: add(a, "--kernel") ?: add(a, "%s", s->kernel) ?:
	      add(a, "--cmdline") ?: add(a, "%s", s->cmdline) ?: add(a, "--mem") ?:
	      add(a, "%lluB", (unsigned long long)s->mem_bytes) ?: add(a, "--vcpus") ?:
	      add(a, "%d", s->vcpus) ?: add(a, "--track-dirty-pages");
	if (!ret && s->cpu_template[0])
		ret = add(a, "--cpu-template") ?: add(a, "%s", s->cpu_template);
	/*
	 * A named sandbox lives for hours: free page reporting gives what its guest frees back to
	 * the host (the guest reports 4 MiB blocks, at most every 2 s; nothing polls).
	 */
	if (!ret)
		ret = add(a, "--balloon");
	if (!ret && s->initrd[0])
		ret = add(a, "--initrd") ?: add(a, "%s", s->initrd);
	for (int i = 0; !ret && i < s->nr_disks; i++) {
		const struct sbx_disk *d = &s->disks[i];

		char rate[128];

		ret = disk_rate_format(&d->rate, rate, sizeof(rate)) ?: add(a, "--disk");
		/*
		 * The first top lives in the chain directory, as every later one does: the jail
		 * binds that directory, never the sandbox's own (spec, locks, event log).
		 */
		if (!ret && d->overlay)
			ret = add(a, "%s,overlay=%s/%s/%s/disk%d.ovl%s", d->path, r->state, name,
				  SBX_CHAIN, i, rate);
		else if (!ret)
			ret = add(a, "%s%s%s", d->path, d->read_only ? ",ro" : "", rate);
	}
	if (!ret && s->key[0])
		ret = add(a, "--snapshot-key") ?: add(a, "%s", s->key);
	return ret ?: common_args(a, r, name, s);
}

int sbx_args_restore(struct sbx_args *a, const struct sbx_root *r, const char *name,
		     const struct sbx_spec *s)
{
	int ret;

	memset(a, 0, sizeof(*a));
	ret = add(a, "cove") ?: add(a, "restore") ?: add(a, "%s/%s/%s", r->state, name, SBX_CHAIN);
	/* A disk under an overlay is given as its base: its layers are files in the chain. */
	for (int i = 0; !ret && i < s->nr_disks; i++) {
		char rate[128]; /* limits come from the spec at every restore, never the chain */

		ret = disk_rate_format(&s->disks[i].rate, rate, sizeof(rate))
			  ?: add(a, "--disk")
			  ?: add(a, "%s%s%s", s->disks[i].path,
				 s->disks[i].read_only && !s->disks[i].overlay ? ",ro" : "", rate);
	}
	if (!ret && s->key[0])
		ret = add(a, "--key") ?: add(a, "%s", s->key);
	/* It says "ok" there once its vCPUs run (lifecycle/launch.c puts the pipe there). */
	if (!ret)
		ret = add(a, "--ready-fd") ?: add(a, "%d", SBX_READY_FD);
	return ret ?: common_args(a, r, name, s);
}
