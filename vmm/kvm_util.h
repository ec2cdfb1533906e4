/* KVM ioctl wrappers in pairs: raw (returns -errno) and checked (also logs which ioctl failed). */
#ifndef COVE_KVM_UTIL_H
#define COVE_KVM_UTIL_H

#include <errno.h>
#include <string.h>
#include <sys/ioctl.h>

#include "common/log.h"

/* Returns the ioctl's non-negative result or -errno (no retry: KVM_RUN's EINTR matters). */
static inline int kvm_ioctl_raw(int fd, unsigned long req, void *arg)
{
	int r = ioctl(fd, req, arg);
	return r < 0 ? -errno : r;
}

int kvm_ioctl_checked(struct logger *log, int fd, unsigned long req, const char *name, void *arg);

#define KVM_IOCTL(log, fd, req, arg) kvm_ioctl_checked((log), (fd), (req), #req, (arg))

#endif
