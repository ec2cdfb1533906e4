/* Test-only pauses at named phases of `cove restore` (COVE_TEST_PHASE_DIR); see phase_hook.h. */
#include "sandbox/phase_hook.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/dirfd_io.h"
#include "common/errmsg.h"

static int write_reached(int dfd, const char *dir, const char *name, char *err, size_t errlen)
{
	/* O_NONBLOCK: a FIFO planted under the name must not block the open. */
	int fd = openat(dfd, name,
			O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
	if (fd < 0)
		return errmsg(err, errlen, -errno, "%s/%s: %s", dir, name,
			      errno == ELOOP ? "a symbolic link, refused" : strerror(errno));
	struct stat st;
	int r = 0;
	if (fstat(fd, &st) < 0)
		r = errmsg(err, errlen, -errno, "%s/%s: %s", dir, name, strerror(errno));
	else if (!S_ISREG(st.st_mode))
		r = errmsg(err, errlen, -EINVAL, "%s/%s: not a regular file", dir, name);
	else if (dprintf(fd, "%d\n", (int)getpid()) < 0)
		r = errmsg(err, errlen, -EIO, "%s/%s: cannot write", dir, name);
	close(fd);
	return r;
}

int phase_hook_wait(const char *dir, const char *phase, uint64_t timeout_ms, char *err,
		    size_t errlen)
{
	char reached[128], go[128];
	if (!dirfd_plain_name(phase) ||
	    snprintf(reached, sizeof(reached), "%s.reached", phase) >= (int)sizeof(reached) ||
	    snprintf(go, sizeof(go), "%s.go", phase) >= (int)sizeof(go))
		return errmsg(err, errlen, -EINVAL, "phase '%s': not a plain name", phase);
	int dfd = dirfd_open_dir(dir, false, err, errlen);
	if (dfd < 0)
		return dfd;
	int r = write_reached(dfd, dir, reached, err, errlen);
	uint64_t t0 = mono_us();
	while (!r) {
		struct stat st;
		if (!fstatat(dfd, go, &st, AT_SYMLINK_NOFOLLOW))
			break;
		if (errno != ENOENT) {
			r = errmsg(err, errlen, -errno, "%s/%s: %s", dir, go, strerror(errno));
			break;
		}
		if (mono_us() - t0 >= timeout_ms * 1000) {
			r = errmsg(err, errlen, -ETIMEDOUT, "%s/%s: not there after %llu ms", dir,
				   go, (unsigned long long)timeout_ms);
			break;
		}
		struct timespec ts = {.tv_nsec = PHASE_HOOK_POLL_MS * 1000000L};
		nanosleep(&ts, NULL);
	}
	close(dfd);
	return r;
}

int phase_hook(const char *dir, const char *phase, struct logger *log)
{
	if (!dir)
		return 0;
	char err[512];
	uint64_t t0 = mono_us();
	int r = phase_hook_wait(dir, phase, PHASE_HOOK_TIMEOUT_MS, err, sizeof(err));
	if (r == -ETIMEDOUT) {
		log_warn(log, "test phase hook: %s; going on", err);
		return 0;
	}
	if (r) {
		log_err(log, "test phase hook: %s", err);
		return r;
	}
	log_info(log, "test phase hook: %s released after %llu us", phase,
		 (unsigned long long)(mono_us() - t0));
	return 0;
}
