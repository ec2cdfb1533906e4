/* OCI bundles and process objects (oci/bundle.h). */
#include "oci/bundle.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/errmsg.h"
#include "common/size_parse.h"

/* A JSON array of strings into a NULL-terminated copy; *bytes counts what they take. */
static int strings(json_t *a, const char *what, size_t max, char ***out, size_t *n, size_t *bytes,
		   char *err, size_t errlen)
{
	size_t i;
	json_t *v;

	*out = NULL;
	*n = 0;
	if (!a)
		return 0;
	if (!json_is_array(a))
		return errmsg(err, errlen, -EINVAL, "process.%s is not an array", what);
	if (json_array_size(a) > max)
		return errmsg(err, errlen, -EINVAL, "process.%s has more than %zu entries", what,
			      max);
	*out = calloc(json_array_size(a) + 1, sizeof(char *));
	if (!*out)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	json_array_foreach(a, i, v)
	{
		const char *s = json_string_value(v);
		if (!s)
			return errmsg(err, errlen, -EINVAL, "process.%s[%zu] is not a string", what,
				      i);
		size_t len = json_string_length(v);
		if (strlen(s) != len)
			return errmsg(err, errlen, -EINVAL, "process.%s[%zu] holds a NUL byte",
				      what, i);
		*bytes += len + 1;
		if (*bytes > OCI_STRINGS_MAX)
			return errmsg(err, errlen, -EINVAL,
				      "process args and env take more than %d bytes",
				      OCI_STRINGS_MAX);
		if (!((*out)[i] = strdup(s)))
			return errmsg(err, errlen, -ENOMEM, "out of memory");
		(*n)++;
	}
	return 0;
}

static int id_of(json_t *user, const char *key, uint32_t *out, char *err, size_t errlen)
{
	json_t *v = json_object_get(user, key);
	*out = 0;
	if (!v)
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < 0 ||
	    json_integer_value(v) > (json_int_t)UINT32_MAX - 1)
		return errmsg(err, errlen, -EINVAL, "process.user.%s is not a uid or gid", key);
	*out = (uint32_t)json_integer_value(v);
	return 0;
}

int oci_process_parse(json_t *j, struct oci_process *p, char *err, size_t errlen)
{
	size_t bytes = 0;
	int r;

	memset(p, 0, sizeof(*p));
	if (!json_is_object(j))
		return errmsg(err, errlen, -EINVAL, "process is not an object");
	r = strings(json_object_get(j, "args"), "args", OCI_ARGS_MAX, &p->args, &p->nargs, &bytes,
		    err, errlen);
	if (!r)
		r = strings(json_object_get(j, "env"), "env", OCI_ARGS_MAX, &p->env, &p->nenv,
			    &bytes, err, errlen);
	if (r)
		return r;
	if (!p->nargs || !p->args[0][0])
		return errmsg(err, errlen, -EINVAL, "process.args is empty");
	for (size_t i = 0; i < p->nenv; i++)
		if (!strchr(p->env[i], '=') || p->env[i][0] == '=')
			return errmsg(err, errlen, -EINVAL, "process.env[%zu] is not K=V", i);
	json_t *cwd = json_object_get(j, "cwd");
	const char *c = cwd ? json_string_value(cwd) : "/";
	if (!c || c[0] != '/' || strlen(c) >= sizeof(p->cwd))
		return errmsg(err, errlen, -EINVAL, "process.cwd is not an absolute path");
	strcpy(p->cwd, c);
	json_t *user = json_object_get(j, "user");
	if (user && !json_is_object(user))
		return errmsg(err, errlen, -EINVAL, "process.user is not an object");
	r = id_of(user, "uid", &p->uid, err, errlen) ?: id_of(user, "gid", &p->gid, err, errlen);
	if (r)
		return r;
	json_t *t = json_object_get(j, "terminal");
	if (t && !json_is_boolean(t))
		return errmsg(err, errlen, -EINVAL, "process.terminal is not a boolean");
	p->terminal = json_is_true(t);
	return oci_rlimits_parse(json_object_get(j, "rlimits"), p, err, errlen);
}

void oci_process_free(struct oci_process *p)
{
	for (size_t i = 0; p->args && i < p->nargs; i++)
		free(p->args[i]);
	for (size_t i = 0; p->env && i < p->nenv; i++)
		free(p->env[i]);
	free(p->args);
	free(p->env);
	memset(p, 0, sizeof(*p));
}

int oci_process_parse_text(const char *text, size_t len, struct oci_process *p, char *err,
			   size_t errlen)
{
	json_error_t je;
	memset(p, 0, sizeof(*p));
	if (len > OCI_CONFIG_MAX)
		return errmsg(err, errlen, -EFBIG, "more than %d bytes", OCI_CONFIG_MAX);
	json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	if (!j)
		return errmsg(err, errlen, -EINVAL, "not JSON: %s (line %d)", je.text, je.line);
	int r = oci_process_parse(j, p, err, errlen);
	json_decref(j);
	if (r)
		oci_process_free(p);
	return r;
}

/* A JSON file, size-capped, not through a symlink at its last component. */
static int load_json(const char *path, json_t **out, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	struct stat st;
	json_error_t je;

	if (fd < 0)
		return errmsg(err, errlen, -errno, "%s: %s", path, strerror(errno));
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > OCI_CONFIG_MAX) {
		close(fd);
		return errmsg(err, errlen, -EFBIG, "%s: not a regular file of at most %d bytes",
			      path, OCI_CONFIG_MAX);
	}
	*out = json_loadfd(fd, JSON_REJECT_DUPLICATES, &je);
	close(fd);
	if (!*out)
		return errmsg(err, errlen, -EINVAL, "%s: not JSON: %s (line %d)", path, je.text,
			      je.line);
	return 0;
}

int oci_process_load(const char *path, struct oci_process *p, char *err, size_t errlen)
{
	json_t *j;
	int r = load_json(path, &j, err, errlen);
	if (r) {
		memset(p, 0, sizeof(*p));
		return r;
	}
	r = oci_process_parse(j, p, err, errlen);
	json_decref(j);
	if (r)
		oci_process_free(p);
	return r;
}

bool oci_hostname_valid(const char *h)
{
	size_t n = strlen(h);

	if (n > OCI_HOSTNAME_MAX || h[0] == '-' || h[0] == '.')
		return false;
	return strspn(h, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.") == n;
}

bool oci_policy_name_valid(const char *name)
{
	size_t n = strlen(name);
	const char *first = "abcdefghijklmnopqrstuvwxyz0123456789";

	return n && n <= OCI_POLICY_NAME_MAX && strchr(first, name[0]) &&
	       strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789_-") == n;
}

/* The cove.dev/ annotations: the image to boot, RAM, vCPUs and the policy (a name: the host's
 * configuration says which file, oci_host_conf_apply). */
static int annotations(struct oci_bundle *b, char *err, size_t errlen)
{
	json_t *a = b->annotations;
	const char *img = json_string_value(json_object_get(a, OCI_IMAGE_ANNOTATION));
	const char *mem = json_string_value(json_object_get(a, OCI_MEM_ANNOTATION));
	const char *cpus = json_string_value(json_object_get(a, OCI_VCPUS_ANNOTATION));

	if (img && (!img[0] || strlen(img) >= sizeof(b->image)))
		return errmsg(err, errlen, -EINVAL, "annotation %s: bad image name",
			      OCI_IMAGE_ANNOTATION);
	if (img)
		strcpy(b->image, img);
	if (mem && (size_parse(mem, &b->mem_bytes) || b->mem_bytes < (64ULL << 20) ||
		    b->mem_bytes > (64ULL << 30)))
		return errmsg(err, errlen, -EINVAL, "annotation %s: want 64M to 64G, not '%.40s'",
			      OCI_MEM_ANNOTATION, mem);
	if (cpus) {
		char *end;
		long n = strtol(cpus, &end, 10);
		if (*end || n < 1 || n > 64)
			return errmsg(err, errlen, -EINVAL, "annotation %s: want 1 to 64",
				      OCI_VCPUS_ANNOTATION);
		b->vcpus = (int)n;
	}
	json_t *pol = json_object_get(a, OCI_POLICY_ANNOTATION);
	if (pol && (!json_is_string(pol) || !oci_policy_name_valid(json_string_value(pol))))
		return errmsg(err, errlen, -EINVAL,
			      "annotation %s: want the name of one of this host's policies "
			      "([a-z0-9][a-z0-9_-]{0,63}), never a path or JSON",
			      OCI_POLICY_ANNOTATION);
	if (pol)
		strcpy(b->policy, json_string_value(pol));
	const char *type = json_string_value(json_object_get(a, OCI_CRI_TYPE_ANNOTATION));
	b->holder = type && !strcmp(type, "sandbox");
	return 0;
}

int oci_bundle_load(const char *dir, struct oci_bundle *b, char *err, size_t errlen)
{
	char path[PATH_MAX + 16], *real;
	json_t *j = NULL;
	int r;

	memset(b, 0, sizeof(*b));
	if (!(real = realpath(dir, NULL)))
		return errmsg(err, errlen, -errno, "bundle %s: %s", dir, strerror(errno));
	r = strlen(real) < sizeof(b->dir) ? 0 : -ENAMETOOLONG;
	if (!r)
		strcpy(b->dir, real);
	free(real);
	if (r)
		return errmsg(err, errlen, r, "bundle %s: path too long", dir);
	snprintf(path, sizeof(path), "%s/config.json", b->dir);
	r = load_json(path, &j, err, errlen);
	if (r)
		return r;
	json_t *root = json_object_get(j, "root");
	const char *rp = json_string_value(json_object_get(root, "path"));
	if (!rp || !rp[0]) {
		r = errmsg(err, errlen, -EINVAL, "config.json: root.path is missing");
		goto out;
	}
	b->readonly = json_is_true(json_object_get(root, "readonly"));
	snprintf(path, sizeof(path), "%s%s%s", rp[0] == '/' ? "" : b->dir, rp[0] == '/' ? "" : "/",
		 rp);
	struct stat st;
	if (!(real = realpath(path, NULL)) || stat(real, &st) < 0 || !S_ISDIR(st.st_mode) ||
	    strlen(real) >= sizeof(b->rootfs)) {
		r = errmsg(err, errlen, -ENOTDIR,
			   "config.json: root.path %.200s is not a directory", rp);
		free(real);
		goto out;
	}
	strcpy(b->rootfs, real);
	free(real);
	json_t *jh = json_object_get(j, "hostname");
	const char *h = json_string_value(jh);
	if (jh && !json_is_null(jh) &&
	    (!h || strlen(h) != json_string_length(jh) || !oci_hostname_valid(h))) {
		r = errmsg(err, errlen, -EINVAL,
			   "config.json: hostname is not a host name (at most %d letters, digits, "
			   "'-' and '.')",
			   OCI_HOSTNAME_MAX);
		goto out;
	}
	snprintf(b->hostname, sizeof(b->hostname), "%s", h ? h : "");
	json_t *a = json_object_get(j, "annotations");
	if (a && !json_is_object(a)) {
		r = errmsg(err, errlen, -EINVAL, "config.json: annotations is not an object");
		goto out;
	}
	b->annotations = a ? json_incref(a) : json_object();
	const char *ver = json_string_value(json_object_get(j, "ociVersion"));
	if (ver && strncmp(ver, "1.", 2)) {
		r = errmsg(err, errlen, -EINVAL, "config.json: ociVersion %.40s is not 1.x", ver);
		goto out;
	}
	/* A holder (a pod's own container) has no VM: its mounts mean nothing. */
	r = annotations(b, err, errlen);
	if (!r && !b->holder)
		r = oci_mounts_plan(j, b, err, errlen);
	if (!r) {
		r = oci_process_parse(json_object_get(j, "process"), &b->process, err, errlen);
		if (r)
			oci_process_free(&b->process);
	}
out:
	json_decref(j);
	if (r)
		oci_bundle_free(b);
	return r;
}

void oci_bundle_free(struct oci_bundle *b)
{
	free(b->mounts);
	b->mounts = NULL;
	b->nmounts = 0;
	oci_process_free(&b->process);
	json_decref(b->annotations);
	b->annotations = NULL;
}
