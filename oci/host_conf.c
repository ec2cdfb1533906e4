/* cove-oci's host configuration (oci/host_conf.h): the caps on what annotations ask. */
#include "oci/host_conf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "common/errmsg.h"
#include "common/size_parse.h"

#define MEM_MIN (64ULL << 20)
#define MEM_MAX (64ULL << 30)

/* max_mem: "4G" or a number of bytes, 64M..64G. */
static int max_mem_of(struct oci_host_conf *c, json_t *v, char *err, size_t errlen)
{
	uint64_t n = 0;
	int r = 0;

	if (json_is_string(v))
		r = size_parse(json_string_value(v), &n);
	else if (json_is_integer(v) && json_integer_value(v) >= 0)
		n = (uint64_t)json_integer_value(v);
	else
		r = -EINVAL;
	if (r || n < MEM_MIN || n > MEM_MAX)
		return errmsg(err, errlen, -EINVAL, "%s: max_mem: want a size of 64M to 64G",
			      c->path);
	c->max_mem = n;
	return 0;
}

static int policies_of(struct oci_host_conf *c, json_t *v, char *err, size_t errlen)
{
	const char *name;
	json_t *p;

	if (!json_is_object(v))
		return errmsg(err, errlen, -EINVAL, "%s: policies is not an object", c->path);
	if (json_object_size(v) > OCI_HOST_POLICIES_MAX)
		return errmsg(err, errlen, -EINVAL, "%s: more than %d policies", c->path,
			      OCI_HOST_POLICIES_MAX);
	if (!json_object_size(v))
		return 0;
	c->policies = calloc(json_object_size(v), sizeof(*c->policies));
	if (!c->policies)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	json_object_foreach(v, name, p)
	{
		struct oci_host_policy *hp = &c->policies[c->npolicies];
		const char *file = json_string_value(p);

		if (!oci_policy_name_valid(name))
			return errmsg(err, errlen, -EINVAL,
				      "%s: policy name '%.40s' is not [a-z0-9][a-z0-9_-]{0,63}",
				      c->path, name);
		if (!file || file[0] != '/' || strlen(file) != json_string_length(p) ||
		    strlen(file) >= sizeof(hp->path))
			return errmsg(err, errlen, -EINVAL,
				      "%s: policies.%s is not an absolute path", c->path, name);
		strcpy(hp->name, name);
		strcpy(hp->path, file);
		c->npolicies++;
	}
	return 0;
}

static int conf_parse(struct oci_host_conf *c, json_t *j, char *err, size_t errlen)
{
	const char *key;
	json_t *v;
	int r = 0;

	if (!json_is_object(j))
		return errmsg(err, errlen, -EINVAL, "%s: not a JSON object", c->path);
	json_object_foreach(j, key, v)
	{
		if (!strcmp(key, "max_mem")) {
			r = max_mem_of(c, v, err, errlen);
		} else if (!strcmp(key, "max_vcpus")) {
			if (!json_is_integer(v) || json_integer_value(v) < 1 ||
			    json_integer_value(v) > 64)
				return errmsg(err, errlen, -EINVAL,
					      "%s: max_vcpus: want an integer 1 to 64", c->path);
			c->max_vcpus = (int)json_integer_value(v);
		} else if (!strcmp(key, "policies")) {
			r = policies_of(c, v, err, errlen);
		} else if (!strcmp(key, "max_root_disks")) {
			if (!json_is_integer(v) || json_integer_value(v) < 1 ||
			    json_integer_value(v) > 4096)
				return errmsg(err, errlen, -EINVAL,
					      "%s: max_root_disks: want an integer 1 to 4096",
					      c->path);
			c->max_root_disks = (unsigned)json_integer_value(v);
		} else {
			return errmsg(err, errlen, -EINVAL,
				      "%s: unknown key '%.40s' (max_mem, max_vcpus, policies, "
				      "max_root_disks)",
				      c->path, key);
		}
		if (r)
			return r;
	}
	return 0;
}

int oci_host_conf_load(const char *path, struct oci_host_conf *c, char *err, size_t errlen)
{
	struct stat st;
	json_error_t je;
	json_t *j;
	int fd, r;

	memset(c, 0, sizeof(*c));
	c->max_mem = OCI_HOST_MEM_DEFAULT;
	c->max_vcpus = OCI_HOST_VCPUS_DEFAULT;
	c->max_root_disks = OCI_HOST_ROOT_DISKS_DEFAULT;
	if (!path)
		path = getenv(OCI_HOST_CONF_ENV);
	if (!path || !path[0])
		path = OCI_HOST_CONF_DEFAULT;
	if (strlen(path) >= sizeof(c->path))
		return errmsg(err, errlen, -ENAMETOOLONG, "%s: path too long", OCI_HOST_CONF_ENV);
	strcpy(c->path, path);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT)
		return 0;
	if (fd < 0)
		return errmsg(err, errlen, -errno, "%s: %s", path, strerror(errno));
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > OCI_HOST_CONF_MAX) {
		close(fd);
		return errmsg(err, errlen, -EFBIG, "%s: not a regular file of at most %d bytes",
			      path, OCI_HOST_CONF_MAX);
	}
	j = json_loadfd(fd, JSON_REJECT_DUPLICATES, &je);
	close(fd);
	if (!j)
		return errmsg(err, errlen, -EINVAL, "%s: not JSON: %s (line %d)", path, je.text,
			      je.line);
	r = conf_parse(c, j, err, errlen);
	json_decref(j);
	if (r)
		oci_host_conf_free(c);
	return r;
}

void oci_host_conf_free(struct oci_host_conf *c)
{
	free(c->policies);
	c->policies = NULL;
	c->npolicies = 0;
}

/* A size as people write it: 2G, 512M, 1536K, or bytes. */
static void size_text(uint64_t n, char *out, size_t cap)
{
	static const char units[] = "GMK";
	for (int i = 0; i < 3; i++) {
		unsigned shift = 30 - 10 * (unsigned)i;
		if (n && !(n & ((1ULL << shift) - 1))) {
			snprintf(out, cap, "%llu%c", (unsigned long long)(n >> shift), units[i]);
			return;
		}
	}
	snprintf(out, cap, "%llu", (unsigned long long)n);
}

int oci_host_conf_apply(const struct oci_host_conf *c, struct oci_bundle *b, char *err,
			size_t errlen)
{
	char cap[32];

	size_text(c->max_mem, cap, sizeof(cap));
	if (b->mem_bytes > c->max_mem)
		return errmsg(
		    err, errlen, -EINVAL, "%s %.40s is over this host's cap %s (max_mem in %s)",
		    OCI_MEM_ANNOTATION,
		    json_string_value(json_object_get(b->annotations, OCI_MEM_ANNOTATION)), cap,
		    c->path);
	if (b->vcpus > c->max_vcpus)
		return errmsg(err, errlen, -EINVAL,
			      "%s %d is over this host's cap %d (max_vcpus in %s)",
			      OCI_VCPUS_ANNOTATION, b->vcpus, c->max_vcpus, c->path);
	if (!b->mem_bytes && c->max_mem < OCI_HOST_SANDBOX_MEM_DEFAULT)
		b->mem_bytes = c->max_mem;
	b->policy_file[0] = '\0';
	if (!b->policy[0])
		return 0;
	for (size_t i = 0; i < c->npolicies; i++)
		if (!strcmp(c->policies[i].name, b->policy)) {
			strcpy(b->policy_file, c->policies[i].path);
			return 0;
		}
	return errmsg(err, errlen, -EINVAL, "%s %s: this host has no such policy (policies in %s)",
		      OCI_POLICY_ANNOTATION, b->policy, c->path);
}
