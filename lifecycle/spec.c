/* spec.json: reading and writing a sandbox's host configuration. */
#include "lifecycle/spec.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "common/file_io.h"
#include "common/hex.h"

static json_t *disks_json(const struct sbx_spec *s)
{
	json_t *a = json_array();

	for (int i = 0; a && i < s->nr_disks; i++) {
		const struct rate_limit *rl = &s->disks[i].rate;
		json_array_append_new(
		    a, json_pack("{s:s,s:b,s:b,s:I,s:I,s:I,s:I}", "path", s->disks[i].path, "ro",
				 s->disks[i].read_only, "overlay", s->disks[i].overlay, "bw",
				 (json_int_t)rl->bw, "burst", (json_int_t)rl->bw_burst, "iops",
				 (json_int_t)rl->iops, "iops_burst", (json_int_t)rl->iops_burst));
	}
	return a;
}

int sbx_spec_write(int dfd, const struct sbx_spec *s)
{
	json_t *j = json_pack(
	    "{s:i,s:s,s:s,s:s,s:I,s:i,s:o,s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:b,s:b}", "version", 1,
	    "kernel", s->kernel, "initrd", s->initrd, "cmdline", s->cmdline, "mem_bytes",
	    (json_int_t)s->mem_bytes, "vcpus", s->vcpus, "disks", disks_json(s), "key", s->key,
	    "policy", s->policy, "snapshot_every_ms", (json_int_t)s->snapshot_every_ms,
	    "idle_stop_ms", (json_int_t)s->idle_stop_ms, "archive_after_ms",
	    (json_int_t)s->archive_after_ms, "delete_after_ms", (json_int_t)s->delete_after_ms,
	    "created_ms", (json_int_t)s->created_ms, "vsock_rate", (json_int_t)s->vsock_rate,
	    "no_seccomp", s->no_seccomp, "no_jail", s->no_jail);
	char *text;

	if (j && s->machine_id[0])
		json_object_set_new(j, "machine_id", json_string(s->machine_id));
	if (j && s->cpu_template[0])
		json_object_set_new(j, "cpu_template", json_string(s->cpu_template));
	int fd, ret;

	if (!j)
		return -ENOMEM;
	text = json_dumps(j, JSON_INDENT(2));
	json_decref(j);
	if (!text)
		return -ENOMEM;
	fd = dirfd_create(dfd, ".spec.json.tmp", O_WRONLY | O_CLOEXEC, 0600);
	if (fd < 0) {
		free(text);
		return fd;
	}
	ret = pwrite_full(fd, text, strlen(text), 0);
	if (!ret && fsync(fd) < 0)
		ret = -errno;
	close(fd);
	free(text);
	if (!ret)
		ret = dirfd_rename(dfd, ".spec.json.tmp", SBX_SPEC);
	if (!ret)
		ret = dirfd_sync(dfd);
	return ret;
}

static int get_str(json_t *j, const char *key, char *out, size_t cap, bool abs_path)
{
	const char *v = json_string_value(json_object_get(j, key));

	if (!v || strlen(v) >= cap || (abs_path && v[0] && v[0] != '/'))
		return -EINVAL;
	strcpy(out, v);
	return 0;
}

static int get_u64(json_t *j, const char *key, uint64_t *out)
{
	json_t *v = json_object_get(j, key);

	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return -EINVAL;
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

/* A rate limit value: absent (a spec from before limits) is 0, else 0..TB_MAX_TOKENS. */
static int get_rate(json_t *j, const char *key, uint64_t *out)
{
	*out = 0;
	if (!json_object_get(j, key))
		return 0;
	return get_u64(j, key, out) || *out > TB_MAX_TOKENS ? -EINVAL : 0;
}

static int get_disks(json_t *j, struct sbx_spec *s)
{
	json_t *a = json_object_get(j, "disks"), *d;
	size_t i;

	if (!json_is_array(a) || json_array_size(a) > SBX_MAX_DISKS)
		return -EINVAL;
	json_array_foreach(a, i, d)
	{
		struct sbx_disk *k = &s->disks[i];

		if (get_str(d, "path", k->path, sizeof(k->path), true) || !k->path[0] ||
		    !json_is_boolean(json_object_get(d, "ro")) ||
		    !json_is_boolean(json_object_get(d, "overlay")))
			return -EINVAL;
		if (get_rate(d, "bw", &k->rate.bw) || get_rate(d, "burst", &k->rate.bw_burst) ||
		    get_rate(d, "iops", &k->rate.iops) ||
		    get_rate(d, "iops_burst", &k->rate.iops_burst))
			return -EINVAL;
		k->read_only = json_is_true(json_object_get(d, "ro"));
		k->overlay = json_is_true(json_object_get(d, "overlay"));
	}
	s->nr_disks = (int)json_array_size(a);
	return 0;
}

int sbx_spec_read(int dfd, struct sbx_spec *s, char *err, size_t errlen)
{
	int fd = dirfd_open(dfd, SBX_SPEC, O_RDONLY | O_CLOEXEC);
	json_error_t je;
	struct stat st;
	uint64_t vcpus = 0, created = 0;
	char *buf;
	json_t *j;
	int ret;

	if (fd < 0)
		return errmsg(err, errlen, fd, "%s: %s", SBX_SPEC, strerror(-fd));
	if (fstat(fd, &st) < 0 || st.st_size <= 0 || st.st_size > SBX_SPEC_MAX) {
		close(fd);
		return errmsg(err, errlen, -EINVAL, "%s: empty or larger than %d bytes", SBX_SPEC,
			      SBX_SPEC_MAX);
	}
	buf = malloc((size_t)st.st_size + 1);
	ret = buf ? pread_full(fd, buf, (size_t)st.st_size, 0) : -ENOMEM;
	close(fd);
	if (ret) {
		free(buf);
		return errmsg(err, errlen, ret, "%s: %s", SBX_SPEC, strerror(-ret));
	}
	buf[st.st_size] = '\0';
	j = json_loads(buf, 0, &je);
	free(buf);
	if (!j)
		return errmsg(err, errlen, -EINVAL, "%s: line %d: %s", SBX_SPEC, je.line, je.text);
	memset(s, 0, sizeof(*s));
	ret = json_integer_value(json_object_get(j, "version")) == 1 ? 0 : -EINVAL;
	ret = ret ?: get_str(j, "kernel", s->kernel, sizeof(s->kernel), true);
	ret = ret ?: get_str(j, "initrd", s->initrd, sizeof(s->initrd), true);
	ret = ret ?: get_str(j, "cmdline", s->cmdline, sizeof(s->cmdline), false);
	ret = ret ?: get_str(j, "key", s->key, sizeof(s->key), false);
	ret = ret ?: get_str(j, "policy", s->policy, sizeof(s->policy), true);
	ret = ret ?: get_u64(j, "mem_bytes", &s->mem_bytes);
	ret = ret ?: get_u64(j, "vcpus", &vcpus);
	ret = ret ?: get_u64(j, "snapshot_every_ms", &s->snapshot_every_ms);
	ret = ret ?: get_u64(j, "idle_stop_ms", &s->idle_stop_ms);
	ret = ret ?: get_u64(j, "archive_after_ms", &s->archive_after_ms);
	ret = ret ?: get_u64(j, "delete_after_ms", &s->delete_after_ms);
	ret = ret ?: get_u64(j, "created_ms", &created);
	ret = ret ?: get_disks(j, s);
	ret = ret ?: get_rate(j, "vsock_rate", &s->vsock_rate);
	/* A spec from before --no-seccomp has no such key: filters on. */
	json_t *ns = json_object_get(j, "no_seccomp");
	if (!ret && ns && !json_is_boolean(ns))
		ret = -EINVAL;
	s->no_seccomp = json_is_true(ns);
	/* Nor --no-jail: jailed. */
	json_t *nj = json_object_get(j, "no_jail");
	if (!ret && nj && !json_is_boolean(nj))
		ret = -EINVAL;
	s->no_jail = json_is_true(nj);
	/* Nor a machine id: the guest keeps the one it has. */
	if (!ret && json_object_get(j, "machine_id") &&
	    (get_str(j, "machine_id", s->machine_id, sizeof(s->machine_id), false) ||
	     !sbx_machine_id_valid(s->machine_id)))
		ret = -EINVAL;
	/* Nor a CPU template: the guest sees all this host's KVM offers. */
	if (!ret && json_object_get(j, "cpu_template") &&
	    (get_str(j, "cpu_template", s->cpu_template, sizeof(s->cpu_template), false) ||
	     !cpu_template_known(s->cpu_template)))
		ret = -EINVAL;
	json_decref(j);
	if (ret || !s->kernel[0] || vcpus < 1 || vcpus > 255 || !s->mem_bytes)
		return errmsg(err, errlen, -EINVAL, "%s: not a sandbox spec this cove wrote",
			      SBX_SPEC);
	s->vcpus = (int)vcpus;
	s->created_ms = (int64_t)created;
	return 0;
}

int sbx_machine_id_valid(const char *id)
{
	bool nonzero = false;

	if (strlen(id) != SBX_MACHINE_ID_LEN)
		return 0;
	for (const char *p = id; *p; p++) {
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return 0;
		nonzero |= *p != '0';
	}
	return nonzero;
}

int sbx_spec_new_machine_id(struct sbx_spec *s)
{
	uint8_t b[SBX_MACHINE_ID_LEN / 2];

	do {
		if (getrandom(b, sizeof(b), 0) != (ssize_t)sizeof(b))
			return -EIO;
		hex_encode(b, sizeof(b), s->machine_id);
	} while (!sbx_machine_id_valid(s->machine_id));
	return 0;
}
