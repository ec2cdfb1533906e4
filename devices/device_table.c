/* The device type table: adding a device is one line here (and its own file and build line). */
#include "devices/device.h"

#include <string.h>

#define DEVICE_TYPES(X)                                                                            \
	X(virtio_blk_type) X(virtio_vsock_type) X(virtio_rng_type) X(virtio_balloon_type)

#define DECLARE(t) extern const struct device_type t;
DEVICE_TYPES(DECLARE)
#define ENTRY(t) &t,
const struct device_type *const device_types[] = {DEVICE_TYPES(ENTRY) NULL};

const struct device_type *device_type_find(const char *name)
{
	for (int i = 0; device_types[i]; i++)
		if (!strcmp(device_types[i]->name, name))
			return device_types[i];
	return NULL;
}
