/* Checked KVM ioctls: a failure logs one line naming the ioctl and the errno text. */
#include "vmm/kvm_util.h"

int kvm_ioctl_checked(struct logger *log, int fd, unsigned long req, const char *name, void *arg)
{
	int r = kvm_ioctl_raw(fd, req, arg);
	if (r < 0)
		log_err(log, "%s failed: %s", name, strerror(-r));
	return r;
}
