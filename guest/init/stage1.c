/*
 * stage1.c: an image's sandbox boots cove's init initramfs (one file: this cove-init as /init)
 * with the image's ext4 as a disk. PID 1 mounts the disk, puts a tmpfs on its /.cove (a
 * directory `cove image import` adds: the image's own files are never written), copies itself
 * (and cove-fetch) there, moves the disk to / and execs the copy, which then runs as usual.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cove-init.h"

#define NEWROOT "/newroot"

static int copy_exe(const char *from, const char *to)
{
	int in = open(from, O_RDONLY | O_CLOEXEC), out;
	struct stat st;
	int ret = 0;

	if (in < 0)
		return -errno;
	if (fstat(in, &st) < 0) {
		ret = -errno;
		close(in);
		return ret;
	}
	out = open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
	if (out < 0) {
		ret = -errno;
		close(in);
		return ret;
	}
	for (off_t left = st.st_size; left > 0;) {
		ssize_t n = sendfile(out, in, NULL, (size_t)left);
		if (n <= 0) {
			ret = n < 0 ? -errno : -EIO;
			break;
		}
		left -= n;
	}
	close(in);
	close(out);
	return ret;
}

void stage1_switch(struct logger *log, const char *dev)
{
	static const char *const pseudo[] = {"/run", "/tmp", "/dev", "/sys", "/proc"};
	char *const argv[] = {"/.cove/cove-init", NULL};
	struct stat st;
	int ret;

	if (mkdir(NEWROOT, 0755) < 0 && errno != EEXIST) {
		init_err(log, "mkdir %s: %s", NEWROOT, strerror(errno));
		return;
	}
	if (mount(dev, NEWROOT, "ext4", 0, NULL) < 0) {
		init_err(log, "mount %s (the image's root): %s", dev, strerror(errno));
		return;
	}
	/* cove image import adds /.cove; a root cove-oci made from a container's directory has
	 * none: it is made here, in the sandbox's copy-on-write overlay, as mount points are. */
	if (lstat(NEWROOT "/.cove", &st) < 0 && errno == ENOENT)
		mkdir(NEWROOT "/.cove", 0755);
	if (lstat(NEWROOT "/.cove", &st) < 0 || !S_ISDIR(st.st_mode)) {
		init_err(log, "%s: /.cove is not a directory there, and cove-init needs it", dev);
		return;
	}
	if (mount("tmpfs", NEWROOT "/.cove", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64m") <
	    0) {
		init_err(log, "mount tmpfs on /.cove: %s", strerror(errno));
		return;
	}
	ret = copy_exe("/init", NEWROOT "/.cove/cove-init");
	if (ret < 0) {
		init_err(log, "copy of cove-init to /.cove: %s", strerror(-ret));
		return;
	}
	if (access("/cove-fetch", X_OK) == 0 &&
	    (ret = copy_exe("/cove-fetch", NEWROOT "/.cove/cove-fetch")) < 0)
		init_err(log, "copy of cove-fetch to /.cove: %s", strerror(-ret));
	/* The initramfs's own mounts go; stage two mounts them in the image's root. */
	for (size_t i = 0; i < sizeof(pseudo) / sizeof(pseudo[0]); i++)
		umount2(pseudo[i], MNT_DETACH);
	unlink("/init");
	unlink("/cove-fetch");
	if (chdir(NEWROOT) < 0 || mount(".", "/", NULL, MS_MOVE, NULL) < 0 || chroot(".") < 0 ||
	    chdir("/") < 0) {
		init_err(log, "switching to the image's root: %s", strerror(errno));
		return;
	}
	execv(argv[0], argv);
	init_err(log, "exec %s: %s", argv[0], strerror(errno));
}
