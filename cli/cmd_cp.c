/* `cove cp SRC DST`: copies one regular file into or out of a sandbox ("SANDBOX:/path"). */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/errmsg.h"
#include "common/fd_io.h"
#include "cli/sandbox_up.h"
#include "common/term_safe.h"
#include "sandbox/agent_client.h"

#define CP_CHUNK    65536
#define CP_FILE_MAX (1ull << 30) /* the agent's limit too */

static const char cp_usage[] =
    "usage: cove cp SANDBOX:/guest/path LOCAL    (LOCAL '-' writes to stdout)\n"
    "       cove cp LOCAL SANDBOX:/guest/path    (a guest path ending in '/' keeps the name)\n"
    "Copies one regular file (at most 1 GiB) with its permission bits; the guest side is\n"
    "written to a temporary file and renamed, so it never holds half a copy. A file copied\n"
    "out gets only the guest's rwx bits minus the umask (never setuid, setgid or sticky).\n";

/* The mode of a file copied out: the guest chose its bits, so never setuid/setgid/sticky (a
 * setuid-root file on the host from a guest), and the umask applies as to any new file. */
static mode_t cp_local_mode(long guest_mode)
{
	mode_t um = umask(0);

	umask(um);
	return (mode_t)guest_mode & 0777 & ~um;
}

/* "SANDBOX:/path" where SANDBOX resolves to a socket; anything else is a local path. */
static bool remote_split(const char *arg, char *uds, size_t udslen, const char **path)
{
	const char *colon = strchr(arg, ':');
	char name[AGENT_PATH_MAX];

	if (!colon || colon == arg || colon[1] != '/' || (size_t)(colon - arg) >= sizeof(name))
		return false;
	memcpy(name, arg, (size_t)(colon - arg));
	name[colon - arg] = '\0';
	if (sbx_resolve(name, "cove cp", uds, udslen, NULL, 0))
		return false;
	*path = colon + 1;
	return true;
}

/* Sends req (NULL: jansson refused the path) and reads the agent's first reply: the connection,
 * or -errno with err set. */
static int cp_call(const char *uds, json_t *req, json_t **reply, char *err, size_t errlen)
{
	if (!req)
		return errmsg(err, errlen, -EINVAL, "bad path (not UTF-8?)");
	return agent_call(uds, 0, req, reply, err, errlen);
}

static int copy_in(const char *uds, const char *local, const char *gpath, char *err, size_t errlen)
{
	char target[PATH_MAX + 1], *lcopy = strdup(local), *buf = malloc(CP_CHUNK);
	json_t *req = NULL, *reply = NULL;
	unsigned long long done = 0;
	struct stat st;
	int in = -1, fd = -1, ret = -ENOMEM;

	if (!lcopy || !buf)
		goto out;
	in = open(local, O_RDONLY | O_CLOEXEC);
	if (in < 0 || fstat(in, &st) < 0) {
		ret = -errno;
		snprintf(err, errlen, "%.300s: %s", local, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode) || (unsigned long long)st.st_size > CP_FILE_MAX) {
		ret = -EINVAL;
		snprintf(err, errlen, "%.300s: not a regular file of at most 1 GiB", local);
		goto out;
	}
	snprintf(target, sizeof(target), "%s%s", gpath,
		 gpath[strlen(gpath) - 1] == '/' ? basename(lcopy) : "");
	req = json_pack("{s:s,s:s,s:i,s:I}", "op", "put", "path", target, "mode",
			(int)(st.st_mode & 07777), "size", (json_int_t)st.st_size);
	fd = cp_call(uds, req, &reply, err, errlen);
	if (fd < 0) {
		ret = fd;
		goto out;
	}
	json_decref(reply);
	reply = NULL;
	while (done < (unsigned long long)st.st_size) {
		size_t want = (unsigned long long)st.st_size - done < CP_CHUNK
				  ? (size_t)((unsigned long long)st.st_size - done)
				  : CP_CHUNK;

		if (read_upto(in, buf, want) != (ssize_t)want) {
			ret = -EIO;
			snprintf(err, errlen, "%.300s: changed size while being copied", local);
			goto out;
		}
		ret = write_full(fd, buf, want);
		if (ret < 0) {
			snprintf(err, errlen, "agent: send: %s", strerror(-ret));
			goto out;
		}
		done += want;
	}
	ret = wire_msg_read(fd, &reply, err, errlen);
	if (ret == 0 && !json_is_true(json_object_get(reply, "ok"))) {
		const char *e = json_string_value(json_object_get(reply, "error"));

		ret = -EREMOTEIO;
		snprintf(err, errlen, "%s", e ? e : "the agent refused the file");
	}
out:
	if (ret == -ENOMEM)
		snprintf(err, errlen, "out of memory");
	json_decref(req);
	json_decref(reply);
	if (fd >= 0)
		close(fd);
	if (in >= 0)
		close(in);
	free(buf);
	free(lcopy);
	return ret;
}

static int copy_out(const char *uds, const char *gpath, const char *local, char *err, size_t errlen)
{
	char target[PATH_MAX + 1], tmp[PATH_MAX + 16], *gcopy = strdup(gpath),
						       *buf = malloc(CP_CHUNK);
	json_t *req = NULL, *reply = NULL, *jsize, *jmode;
	unsigned long long size, done = 0;
	bool to_stdout = strcmp(local, "-") == 0;
	struct stat st;
	int out = -1, fd = -1, ret = -ENOMEM;
	mode_t mode;

	tmp[0] = '\0';
	if (!gcopy || !buf)
		goto out;
	snprintf(target, sizeof(target), "%s", local);
	if (!to_stdout && stat(local, &st) == 0 && S_ISDIR(st.st_mode))
		snprintf(target, sizeof(target), "%s/%s", local, basename(gcopy));
	req = json_pack("{s:s,s:s}", "op", "get", "path", gpath);
	fd = cp_call(uds, req, &reply, err, errlen);
	if (fd < 0) {
		ret = fd;
		goto out;
	}
	jsize = json_object_get(reply, "size");
	if (!json_is_integer(jsize) || json_integer_value(jsize) < 0 ||
	    (unsigned long long)json_integer_value(jsize) > CP_FILE_MAX) {
		ret = -EPROTO;
		snprintf(err, errlen, "agent: bad size in reply");
		goto out;
	}
	size = (unsigned long long)json_integer_value(jsize);
	jmode = json_object_get(reply, "mode");
	if (!json_is_integer(jmode) || json_integer_value(jmode) < 0 ||
	    json_integer_value(jmode) > 07777) {
		ret = -EPROTO;
		snprintf(err, errlen, "agent: bad mode in reply");
		goto out;
	}
	mode = cp_local_mode((long)json_integer_value(jmode));
	if (to_stdout) {
		out = 1;
	} else {
		snprintf(tmp, sizeof(tmp), "%s.cove-cp.XXXXXX", target);
		out = mkostemp(tmp, O_CLOEXEC);
		if (out < 0) {
			ret = -errno;
			snprintf(err, errlen, "%.300s: %s", target, strerror(errno));
			tmp[0] = '\0';
			goto out;
		}
	}
	while (done < size) {
		size_t want = size - done < CP_CHUNK ? (size_t)(size - done) : CP_CHUNK;

		ret = read_full(fd, buf, want);
		if (ret < 0) {
			snprintf(err, errlen, "agent: connection lost after %llu of %llu bytes",
				 done, size);
			goto out;
		}
		ret = write_full(out, buf, want);
		if (ret < 0) {
			snprintf(err, errlen, "%.300s: %s", to_stdout ? "stdout" : target,
				 strerror(-ret));
			goto out;
		}
		done += want;
	}
	if (!to_stdout) {
		if (fchmod(out, mode) < 0 || fsync(out) < 0 || rename(tmp, target) < 0) {
			ret = -errno;
			snprintf(err, errlen, "%.300s: %s", target, strerror(errno));
			goto out;
		}
		tmp[0] = '\0';
	}
	ret = 0;
out:
	if (ret == -ENOMEM)
		snprintf(err, errlen, "out of memory");
	if (tmp[0])
		unlink(tmp);
	if (out > 1)
		close(out);
	if (fd >= 0)
		close(fd);
	json_decref(req);
	json_decref(reply);
	free(buf);
	free(gcopy);
	return ret;
}

int cmd_cp(int argc, char **argv)
{
	char uds_src[AGENT_PATH_MAX], uds_dst[AGENT_PATH_MAX], err[512];
	const char *gsrc, *gdst;
	bool rsrc, rdst;
	int ret;

	if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
		fputs(cp_usage, stdout);
		return 0;
	}
	if (argc != 3) {
		fprintf(stderr, "cove cp: want SRC and DST (try 'cove cp --help')\n");
		return 2;
	}
	rsrc = remote_split(argv[1], uds_src, sizeof(uds_src), &gsrc);
	rdst = remote_split(argv[2], uds_dst, sizeof(uds_dst), &gdst);
	if (rsrc == rdst) {
		fprintf(stderr, "cove cp: exactly one of SRC and DST must be SANDBOX:/path with a "
				"running sandbox\n");
		return 2;
	}
	ret = rsrc ? copy_out(uds_src, gsrc, argv[2], err, sizeof(err))
		   : copy_in(uds_dst, argv[1], gdst, err, sizeof(err));
	if (ret < 0) {
		char safe[sizeof(err) * 2];

		/* err may quote the agent, i.e. the guest. */
		fprintf(stderr, "cove cp: %s\n", term_safe(err, safe, sizeof(safe)));
		return 1;
	}
	return 0;
}
