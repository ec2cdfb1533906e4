/* The guest part of a new spec: kernel, root (image overlay or initramfs) and command line. */
#include "lifecycle/spec.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/errmsg.h"
#include "lifecycle/guest_files.h"

int sbx_spec_guest(struct sbx_spec *s, const char *name, const char *rootfs_arg, const char *initrd,
		   char *err, size_t errlen)
{
	char rootfs[PATH_MAX];

	snprintf(rootfs, sizeof(rootfs), "%s", rootfs_arg ? rootfs_arg : "");
	if (initrd && initrd[0] && rootfs[0])
		return errmsg(err, errlen, -EINVAL, "--rootfs and --initrd: one root, not both");
	if (initrd && initrd[0]) {
		snprintf(s->initrd, sizeof(s->initrd), "%s", initrd);
		if (!s->kernel[0] && sbx_guest_find(s->kernel, rootfs, sizeof(rootfs), err, errlen))
			return -ENOENT;
	} else {
		if ((!s->kernel[0] || !rootfs[0]) &&
		    sbx_guest_find(s->kernel, rootfs, sizeof(rootfs), err, errlen))
			return -ENOENT;
		/* The shared base image, read-only; the sandbox writes to an overlay of its own. */
		snprintf(s->disks[0].path, sizeof(s->disks[0].path), "%s", rootfs);
		s->disks[0].overlay = true;
		s->nr_disks = 1;
	}
	/*
	 * tsc=reliable: the guest's clocksource is kvm-clock, so the TSC watchdog (a timer every
	 * 0.5 s comparing the two) only wakes an idle guest; on a host with a constant TSC, KVM
	 * keeps the guest's TSC stable.
	 */
	if ((size_t)snprintf(s->cmdline, sizeof(s->cmdline),
			     "console=ttyS0 reboot=k panic=-1 quiet tsc=reliable "
			     "cove.hostname=%s%s",
			     name, s->initrd[0] ? "" : " root=/dev/vda rw init=/sbin/cove-init") >=
	    sizeof(s->cmdline))
		return errmsg(err, errlen, -ENAMETOOLONG, "the kernel command line is too long");
	return 0;
}
