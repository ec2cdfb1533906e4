/* A sandbox's image files (lifecycle/image_files.h). */
#include "lifecycle/image_files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/errmsg.h"

bool sbx_spec_is_image(const struct sbx_spec *s)
{
	return s->initrd[0] && s->nr_disks == 1 && s->disks[0].overlay &&
	       strstr(s->cmdline, " cove.root=/dev/vda");
}

int sbx_image_files_clone(const char *state, int sdfd, int tdfd, const char *to, struct sbx_spec *s,
			  char *err, size_t errlen)
{
	struct stat disk, own;

	/* Disk 0 is the source's own link when both name one file (the spec's path is the
	 * source's directory, which may have been renamed: a clone's temporary name). */
	if (!sbx_spec_is_image(s) || fstatat(sdfd, SBX_IMAGE_EXT4, &own, AT_SYMLINK_NOFOLLOW) < 0 ||
	    stat(s->disks[0].path, &disk) < 0 || disk.st_dev != own.st_dev ||
	    disk.st_ino != own.st_ino)
		return 0;
	static const char *const names[] = {SBX_IMAGE_EXT4, SBX_IMAGE_JSON};
	for (size_t i = 0; i < sizeof(names) / sizeof(*names); i++)
		if (linkat(sdfd, names[i], tdfd, names[i], 0) < 0 && !(errno == ENOENT && i == 1))
			return errmsg(err, errlen, -errno, "cannot link %s: %s", names[i],
				      strerror(errno));
	if (sbx_image_disk_point(s, state, to))
		return errmsg(err, errlen, -ENAMETOOLONG, "the clone's path is too long");
	return 0;
}

int sbx_image_disk_point(struct sbx_spec *s, const char *state, const char *name)
{
	return (size_t)snprintf(s->disks[0].path, sizeof(s->disks[0].path), "%.3800s/%s/%s", state,
				name, SBX_IMAGE_EXT4) < sizeof(s->disks[0].path)
		   ? 0
		   : -ENAMETOOLONG;
}
