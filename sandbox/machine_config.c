/* The machine a snapshot was taken of (RAM, vCPUs, disks, vsock), as JSON in the state file, so restore can rebuild it. */
#include "sandbox/machine_config.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "vmm/guest_mem.h"
#include "vmm/vm.h"

/* A frozen layer's file name: the caller keeps every frozen layer inside the chain directory. */
static const char *base_name(const char *path)
{
	const char *slash = strrchr(path, '/');
	return slash ? slash + 1 : path;
}

char *machine_config_to_json(const struct machine_config *mc)
{
	json_t *disks = json_array();
	for (int i = 0; i < mc->nr_disks; i++) {
		json_t *layers = json_array();
		for (int k = 0; k < mc->chains[i].n; k++)
			json_array_append_new(layers, json_string(base_name(mc->chains[i].paths[k])));
		json_array_append_new(disks, json_pack("{s:I,s:b,s:b,s:o}", "size",
						       (json_int_t)mc->disk_size[i], "ro",
						       mc->disks[i].read_only, "overlay",
						       mc->disks[i].overlay[0] != 0, "layers", layers));
	}
	json_t *root = json_pack("{s:i,s:I,s:i,s:o}", "format", MACHINE_CONFIG_FORMAT, "mem_size",
				 (json_int_t)mc->mem_size, "vcpus", mc->vcpus, "disks", disks);
	if (root && mc->vsock_cid)
		json_object_set_new(root, "vsock", json_pack("{s:I}", "cid", (json_int_t)mc->vsock_cid));
	if (root && mc->cpu_template[0])
		json_object_set_new(root, "cpu_template", json_string(mc->cpu_template));
	/* Written only when there are some, so a machine without them reads as before. */
	if (root && mc->nr_devs) {
		json_t *devs = json_array();
		for (int i = 0; i < mc->nr_devs; i++) {
			const struct device_type *t = mc->devs[i].type;
			json_t *d = t->spec_to_json(mc->devs[i].cfg);
			if (d)
				json_object_set_new(d, "type", json_string(t->name));
			json_array_append_new(devs, d);
		}
		json_object_set_new(root, "devices", devs);
	}
	char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
	json_decref(root);
	return s;
}

static int copy_str(json_t *v, char *out, size_t cap, bool allow_empty)
{
	if (!json_is_string(v))
		return -EINVAL;
	const char *s = json_string_value(v);
	size_t n = strlen(s);
	if (n >= cap || (!allow_empty && n == 0) || n != json_string_length(v))
		return -EINVAL;
	memcpy(out, s, n + 1);
	return 0;
}

/* "devices": [{"type": NAME, ...its spec}]: absent in machines without table devices. */
static int parse_devices(json_t *devs, struct machine_config *mc, char *err, size_t errlen)
{
	if (!devs)
		return 0;
	if (!json_is_array(devs) || json_array_size(devs) > BOARD_MAX_VIRTIO)
		return errmsg(err, errlen, -EINVAL, "state file: \"devices\" is not a short array");
	size_t i;
	json_t *d;
	json_array_foreach(devs, i, d)
	{
		json_t *name = json_object_get(d, "type");
		const struct device_type *t =
			json_is_string(name) ? device_type_find(json_string_value(name)) : NULL;
		if (!json_is_object(d) || !t || !t->spec_from_json)
			return errmsg(err, errlen, -EINVAL, "state file: device %zu has no known type",
				      i);
		char why[160] = "";
		mc->devs[i].type = t;
		if (t->spec_from_json(d, mc->devs[i].cfg, why, sizeof(why)))
			return errmsg(err, errlen, -EINVAL, "state file: %s: %s", t->name, why);
		mc->nr_devs++;
	}
	return 0;
}

int machine_config_parse(const char *json, size_t len, struct machine_config *mc, char *err,
			 size_t errlen)
{
	memset(mc, 0, sizeof(*mc));
	json_error_t je;
	json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
	if (!root || !json_is_object(root)) {
		json_decref(root);
		return errmsg(err, errlen, -EINVAL, "state file: machine description is not JSON");
	}
	int r = -EINVAL;
	json_t *fmt = json_object_get(root, "format");
	if (!json_is_integer(fmt) || json_integer_value(fmt) != MACHINE_CONFIG_FORMAT) {
		errmsg(err, errlen, r,
		       "state file: machine description format %lld is not supported (format %d: "
		       "written before restore took disk and vsock paths from the command line)",
		       json_is_integer(fmt) ? (long long)json_integer_value(fmt) : 1LL,
		       MACHINE_CONFIG_FORMAT);
		goto out;
	}
	json_t *mem = json_object_get(root, "mem_size"), *vcpus = json_object_get(root, "vcpus");
	json_t *disks = json_object_get(root, "disks"), *vsock = json_object_get(root, "vsock");
	if (!json_is_integer(mem) || !json_is_integer(vcpus) || !json_is_array(disks)) {
		errmsg(err, errlen, r, "state file: machine description lacks mem_size/vcpus/disks");
		goto out;
	}
	json_int_t m = json_integer_value(mem), v = json_integer_value(vcpus);
	if (m < (json_int_t)MEM_MIN_SIZE || (uint64_t)m > MEM_MAX_SIZE || m % (json_int_t)PAGE_SIZE ||
	    v < 1 || v > VM_MAX_VCPUS || json_array_size(disks) > RUN_MAX_DISKS) {
		errmsg(err, errlen, r, "state file: machine description is out of range");
		goto out;
	}
	mc->mem_size = (uint64_t)m;
	mc->vcpus = (int)v;
	size_t i;
	json_t *d;
	json_array_foreach(disks, i, d)
	{
		struct disk_opt *o = &mc->disks[i];
		json_t *ro = json_object_get(d, "ro"), *ovl = json_object_get(d, "overlay");
		json_t *size = json_object_get(d, "size");
		if (!json_is_object(d) || !json_is_boolean(ro) || !json_is_boolean(ovl) ||
		    !json_is_integer(size) || json_integer_value(size) <= 0 ||
		    (json_is_true(ro) && json_is_true(ovl))) {
			errmsg(err, errlen, r, "state file: disk %zu is malformed", i);
			goto out;
		}
		o->read_only = json_is_true(ro);
		/* A marker only: restore puts the disk's new top in a directory of its own choice. */
		if (json_is_true(ovl))
			snprintf(o->overlay, sizeof(o->overlay), "top");
		mc->disk_size[i] = (uint64_t)json_integer_value(size);
		/* Frozen overlay layers: plain names inside the chain directory. */
		json_t *layers = json_object_get(d, "layers");
		size_t k;
		json_t *l;
		if (!json_is_array(layers) || json_array_size(layers) > BOARD_DISK_LAYERS ||
		    (json_array_size(layers) && !o->overlay[0])) {
			errmsg(err, errlen, r, "state file: disk %zu has bad overlay layers", i);
			goto out;
		}
		json_array_foreach(layers, k, l)
		{
			if (copy_str(l, mc->chains[i].paths[k], sizeof(mc->chains[i].paths[k]), false) ||
			    !dirfd_plain_name(mc->chains[i].paths[k])) {
				errmsg(err, errlen, r,
				       "state file: disk %zu layer %zu is not a file name inside the chain",
				       i, k);
				goto out;
			}
			mc->chains[i].n++;
		}
		mc->nr_disks++;
	}
	if (vsock) {
		json_t *cid = json_object_get(vsock, "cid");
		if (!json_is_object(vsock) || json_object_size(vsock) != 1 || !json_is_integer(cid) ||
		    json_integer_value(cid) < 3 || json_integer_value(cid) >= (json_int_t)UINT32_MAX) {
			errmsg(err, errlen, r, "state file: vsock description is malformed");
			goto out;
		}
		mc->vsock_cid = (uint64_t)json_integer_value(cid);
	}
	/* A template cove does not ship is refused by name: restoring without it would show the
	 * guest features it never had, or hide ones it uses. */
	json_t *tpl = json_object_get(root, "cpu_template");
	if (tpl && (copy_str(tpl, mc->cpu_template, sizeof(mc->cpu_template), false) ||
		    !cpu_template_known(mc->cpu_template))) {
		char shown[CPU_TEMPLATE_NAME_MAX];
		const char *v = json_is_string(tpl) ? json_string_value(tpl) : "(not a string)";
		size_t k;
		for (k = 0; v[k] && k < sizeof(shown) - 1; k++)
			shown[k] = v[k] >= 0x20 && v[k] < 0x7f ? v[k] : '?';
		shown[k] = '\0';
		mc->cpu_template[0] = '\0';
		errmsg(err, errlen, r,
		       "state file: CPU template \"%s%s\" is not one this cove has (%s)", shown,
		       v[k] ? "..." : "", cpu_template_names());
		goto out;
	}
	r = parse_devices(json_object_get(root, "devices"), mc, err, errlen);
out:
	json_decref(root);
	return r;
}

int machine_disk_size(const char *path, uint64_t *size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	struct stat st;
	int r = 0;
	if (fstat(fd, &st) < 0)
		r = -errno;
	else if (S_ISBLK(st.st_mode))
		r = ioctl(fd, BLKGETSIZE64, size) < 0 ? -errno : 0;
	else if (S_ISREG(st.st_mode))
		*size = (uint64_t)st.st_size;
	else
		r = -EINVAL;
	close(fd);
	return r;
}
