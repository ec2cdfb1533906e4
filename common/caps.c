/* Dropping capabilities: bounding and ambient sets, then the process's own, then no_new_privs. */
#include "common/caps.h"

#include <errno.h>
#include <linux/capability.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/errmsg.h"

int caps_drop_bounding(char *err, size_t errlen)
{
	for (int c = 0; c < 64; c++) {
		if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) == 0)
			continue;
		if (errno == EINVAL) /* past the kernel's last capability */
			break;
		return errmsg(err, errlen, -errno, "drop capability %d: %s", c, strerror(errno));
	}
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) && errno != EINVAL)
		return errmsg(err, errlen, -errno, "ambient capabilities: %s", strerror(errno));
	return 0;
}

int caps_drop_all(char *err, size_t errlen)
{
	struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
	struct __user_cap_data_struct d[_LINUX_CAPABILITY_U32S_3];
	memset(d, 0, sizeof(d));
	if (syscall(SYS_capset, &h, d))
		return errmsg(err, errlen, -errno, "capset: %s", strerror(errno));
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
		return errmsg(err, errlen, -errno, "no_new_privs: %s", strerror(errno));
	return 0;
}
