/* The machine a snapshot was taken of (RAM, vCPUs, disks, vsock), as JSON in the state file, so restore can rebuild it. */
#include "machine_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "errmsg.h"
#include "guest_mem.h"
#include "vm.h"

char *machine_config_to_json(const struct machine_config *mc)
{
	json_t *disks = json_array();
	for (int i = 0; i < mc->nr_disks; i++) {
		json_t *layers = json_array();
		for (int k = 0; k < mc->chains[i].n; k++)
			json_array_append_new(layers, json_string(mc->chains[i].paths[k]));
		json_array_append_new(disks, json_pack("{s:s,s:b,s:s,s:o}", "path",
						       mc->disks[i].path, "ro",
						       mc->disks[i].read_only, "overlay",
						       mc->disks[i].overlay, "layers", layers));
	}
	json_t *root = json_pack("{s:I,s:i,s:o}", "mem_size", (json_int_t)mc->mem_size, "vcpus",
				 mc->vcpus, "disks", disks);
	if (root && mc->vsock_cid)
		json_object_set_new(root, "vsock",
				    json_pack("{s:I,s:s}", "cid", (json_int_t)mc->vsock_cid, "uds",
					      mc->vsock_uds));
	char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
	json_decref(root);
	return s;
}

char *machine_config_json(const struct run_opts *o)
{
	/* Heap: with its disk chains a machine config is about half a MiB. */
	struct machine_config *mc = calloc(1, sizeof(*mc));
	if (!mc)
		return NULL;
	mc->mem_size = o->mem_size;
	mc->vcpus = o->vcpus;
	mc->nr_disks = o->nr_disks;
	memcpy(mc->disks, o->disks, sizeof(mc->disks));
	mc->vsock_cid = o->vsock_cid;
	if (o->vsock_uds)
		snprintf(mc->vsock_uds, sizeof(mc->vsock_uds), "%s", o->vsock_uds);
	char *s = machine_config_to_json(mc);
	free(mc);
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
		json_t *ro = json_object_get(d, "ro");
		if (!json_is_object(d) || copy_str(json_object_get(d, "path"), o->path, sizeof(o->path), false) ||
		    copy_str(json_object_get(d, "overlay"), o->overlay, sizeof(o->overlay), true) ||
		    !json_is_boolean(ro)) {
			errmsg(err, errlen, r, "state file: disk %zu is malformed", i);
			goto out;
		}
		o->read_only = json_is_true(ro);
		/* Frozen overlay layers (absent in machines that were never snapshotted with one). */
		json_t *layers = json_object_get(d, "layers");
		if (layers) {
			size_t k;
			json_t *l;
			if (!json_is_array(layers) || json_array_size(layers) > BOARD_DISK_LAYERS ||
			    (json_array_size(layers) && !o->overlay[0])) {
				errmsg(err, errlen, r, "state file: disk %zu has bad overlay layers", i);
				goto out;
			}
			json_array_foreach(layers, k, l)
			{
				if (copy_str(l, mc->chains[i].paths[k], sizeof(mc->chains[i].paths[k]),
					     false)) {
					errmsg(err, errlen, r, "state file: disk %zu layer %zu is bad", i, k);
					goto out;
				}
				mc->chains[i].n++;
			}
		}
		mc->nr_disks++;
	}
	if (vsock) {
		json_t *cid = json_object_get(vsock, "cid");
		if (!json_is_integer(cid) || json_integer_value(cid) < 3 ||
		    json_integer_value(cid) >= (json_int_t)UINT32_MAX ||
		    copy_str(json_object_get(vsock, "uds"), mc->vsock_uds, 97, false)) {
			errmsg(err, errlen, r, "state file: vsock description is malformed");
			goto out;
		}
		mc->vsock_cid = (uint64_t)json_integer_value(cid);
	}
	r = 0;
out:
	json_decref(root);
	return r;
}
