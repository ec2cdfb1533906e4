/* cove-oci's container records (oci/state.h). */
#include "oci/state.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "common/file_io.h"

#define STATE_MAX (1 << 20)

const char *const oci_cove_vars[3] = {"COVE_STATE_DIR", "COVE_RUN_DIR", "COVE_GUEST_DIR"};

void oci_state_env_take(struct oci_state *s)
{
	for (int i = 0; i < 3; i++) {
		const char *v = getenv(oci_cove_vars[i]);
		snprintf(s->cove_env[i], sizeof(s->cove_env[i]), "%s",
			 v && v[0] == '/' && strlen(v) < sizeof(s->cove_env[i]) ? v : "");
	}
}

void oci_state_env_apply(const struct oci_state *s)
{
	for (int i = 0; i < 3; i++) {
		if (s->cove_env[i][0])
			setenv(oci_cove_vars[i], s->cove_env[i], 1);
		else
			unsetenv(oci_cove_vars[i]);
	}
}

bool oci_id_ok(const char *id)
{
	size_t n = id ? strlen(id) : 0;
	if (!n || n > OCI_ID_MAX || id[0] == '.')
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = id[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '_' || c == '.' || c == '-'))
			return false;
	}
	return true;
}

int oci_sandbox_name(const char *root, const char *id, char *out, size_t cap)
{
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int n = 0;
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) &&
		 EVP_DigestUpdate(ctx, root, strlen(root) + 1) &&
		 EVP_DigestUpdate(ctx, id, strlen(id)) && EVP_DigestFinal_ex(ctx, md, &n);
	EVP_MD_CTX_free(ctx);
	if (!ok || n < 8 || cap < sizeof(OCI_SANDBOX_PREFIX) + 16)
		return -EIO;
	size_t o = (size_t)snprintf(out, cap, "%s", OCI_SANDBOX_PREFIX);
	for (int i = 0; i < 8; i++)
		o += (size_t)snprintf(out + o, cap - o, "%02x", md[i]);
	return 0;
}

int oci_state_dir(const char *root, const char *id, bool create, char *err, size_t errlen)
{
	if (!oci_id_ok(id))
		return errmsg(err, errlen, -EINVAL,
			      "container id '%.140s': want 1 to %d of [A-Za-z0-9_.-], not starting "
			      "with '.'",
			      id, OCI_ID_MAX);
	if (root[0] != '/')
		return errmsg(err, errlen, -EINVAL, "--root %s: not an absolute path", root);
	/* The whole path, as runc makes it: engines name one per namespace under /run. */
	if (create) {
		char p[PATH_MAX];
		if ((size_t)snprintf(p, sizeof(p), "%s/", root) >= sizeof(p))
			return errmsg(err, errlen, -ENAMETOOLONG, "--root: path too long");
		for (char *c = p + 1; *c; c++) {
			if (*c != '/')
				continue;
			*c = '\0';
			if (mkdir(p, 0700) < 0 && errno != EEXIST)
				return errmsg(err, errlen, -errno, "--root %s: %s", p,
					      strerror(errno));
			*c = '/';
		}
	}
	int rfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (rfd < 0)
		return errmsg(err, errlen, -errno, "--root %s: %s", root, strerror(errno));
	if (create && mkdirat(rfd, id, 0700) < 0) {
		int e = errno;
		close(rfd);
		return errmsg(err, errlen, -e,
			      e == EEXIST ? "container %s exists already" : "%s/%s: %s", id,
			      e == EEXIST ? "" : root, strerror(e));
	}
	int dfd = openat(rfd, id, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	int e = errno;
	close(rfd);
	if (dfd < 0)
		return errmsg(err, errlen, e == ENOENT ? -ENOENT : -e,
			      e == ENOENT ? "container %s does not exist" : "container %s: %s", id,
			      strerror(e));
	return dfd;
}

int oci_state_write(int dfd, const struct oci_state *s)
{
	json_t *env = json_object();
	for (int i = 0; env && i < 3; i++)
		if (s->cove_env[i][0])
			json_object_set_new(env, oci_cove_vars[i], json_string(s->cove_env[i]));
	json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:I,s:I,s:s,s:o,s:o,s:b}", "id", s->id, "sandbox",
			      s->sandbox, "bundle", s->bundle, "rootfs", s->rootfs, "pid",
			      (json_int_t)s->pid, "pid_start", (json_int_t)s->pid_start, "created",
			      s->created, "annotations",
			      s->annotations ? json_incref(s->annotations) : json_object(),
			      "cove_env", env, "holder", s->holder);
	char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	if (!text)
		return -ENOMEM;
	int fd = dirfd_create(dfd, "." OCI_STATE_JSON ".tmp", O_WRONLY | O_CLOEXEC, 0600);
	int r = fd < 0 ? fd : pwrite_full(fd, text, strlen(text), 0);
	if (fd >= 0)
		close(fd);
	free(text);
	return r ?: dirfd_rename(dfd, "." OCI_STATE_JSON ".tmp", OCI_STATE_JSON);
}

static int str_field(json_t *j, const char *k, char *out, size_t cap, char *err, size_t errlen)
{
	const char *v = json_string_value(json_object_get(j, k));
	if (!v || strlen(v) >= cap)
		return errmsg(err, errlen, -EBADMSG, "state.json: bad %s", k);
	strcpy(out, v);
	return 0;
}

int oci_state_read(int dfd, struct oci_state *s, char *err, size_t errlen)
{
	memset(s, 0, sizeof(*s));
	int fd = dirfd_open(dfd, OCI_STATE_JSON, O_RDONLY | O_CLOEXEC);
	struct stat st;
	if (fd < 0)
		return errmsg(err, errlen, fd, "state.json: %s", strerror(-fd));
	json_t *j = NULL;
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= STATE_MAX)
		j = json_loadfd(fd, JSON_REJECT_DUPLICATES, NULL);
	close(fd);
	if (!json_is_object(j)) {
		json_decref(j);
		return errmsg(err, errlen, -EBADMSG, "state.json: not a JSON object");
	}
	json_int_t pid = json_integer_value(json_object_get(j, "pid"));
	json_int_t ps = json_integer_value(json_object_get(j, "pid_start"));
	int r = str_field(j, "id", s->id, sizeof(s->id), err, errlen)
		    ?: str_field(j, "sandbox", s->sandbox, sizeof(s->sandbox), err, errlen)
		    ?: str_field(j, "bundle", s->bundle, sizeof(s->bundle), err, errlen)
		    ?: str_field(j, "rootfs", s->rootfs, sizeof(s->rootfs), err, errlen)
		    ?: str_field(j, "created", s->created, sizeof(s->created), err, errlen);
	if (!r && (pid < 0 || pid > (1 << 22) || ps < 0))
		r = errmsg(err, errlen, -EBADMSG, "state.json: bad pid");
	if (!r && (!oci_id_ok(s->id) ||
		   strncmp(s->sandbox, OCI_SANDBOX_PREFIX, strlen(OCI_SANDBOX_PREFIX))))
		r = errmsg(err, errlen, -EBADMSG, "state.json: bad id or sandbox");
	s->holder = json_is_true(json_object_get(j, "holder"));
	json_t *env = json_object_get(j, "cove_env");
	for (int i = 0; !r && env && i < 3; i++) {
		json_t *v = json_object_get(env, oci_cove_vars[i]);
		const char *t = json_string_value(v);
		if (v && (!t || t[0] != '/' || strlen(t) >= sizeof(s->cove_env[i])))
			r = errmsg(err, errlen, -EBADMSG, "state.json: bad %s", oci_cove_vars[i]);
		else if (t)
			strcpy(s->cove_env[i], t);
	}
	if (!r) {
		s->pid = (pid_t)pid;
		s->pid_start = (uint64_t)ps;
		json_t *a = json_object_get(j, "annotations");
		s->annotations = json_is_object(a) ? json_incref(a) : NULL;
	}
	json_decref(j);
	return r;
}

void oci_state_free(struct oci_state *s)
{
	json_decref(s->annotations);
	s->annotations = NULL;
}

uint64_t oci_proc_start(pid_t pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	char *p = strrchr(buf, ')');
	char state;
	unsigned long long start;
	/* after "pid (comm)": state, then fields 4..21, then starttime (22) */
	if (!p ||
	    sscanf(p + 2,
		   "%c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d "
		   "%*d %llu",
		   &state, &start) != 2 ||
	    state == 'Z' || state == 'X')
		return 0;
	return start;
}

bool oci_monitor_alive(const struct oci_state *s)
{
	return s->pid > 0 && s->pid_start && oci_proc_start(s->pid) == s->pid_start;
}

pid_t oci_exec_child(int dfd)
{
	char buf[64] = {0};
	int fd = dirfd_open(dfd, OCI_EXEC_PID, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	int pid;
	unsigned long long start;
	if (n <= 0 || sscanf(buf, "%d %llu", &pid, &start) != 2 || pid <= 0)
		return 0;
	return oci_proc_start(pid) == start ? pid : 0;
}

const char *oci_status(int dfd, const struct oci_state *s)
{
	if (!oci_monitor_alive(s))
		return "stopped";
	if (faccessat(dfd, OCI_STARTED, F_OK, AT_SYMLINK_NOFOLLOW) < 0)
		return "created";
	return faccessat(dfd, OCI_PAUSED, F_OK, AT_SYMLINK_NOFOLLOW) == 0 ? "paused" : "running";
}

json_t *oci_state_json(int dfd, const struct oci_state *s)
{
	const char *status = oci_status(dfd, s);
	return json_pack("{s:s,s:s,s:s,s:I,s:s,s:s,s:s,s:s,s:o}", "ociVersion", "1.0.2", "id",
			 s->id, "status", status, "pid",
			 (json_int_t)(strcmp(status, "stopped") ? s->pid : 0), "bundle", s->bundle,
			 "rootfs", s->rootfs, "created", s->created, "owner", "", "annotations",
			 s->annotations ? json_incref(s->annotations) : json_object());
}
