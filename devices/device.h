/* Device types: one const table says what each device is, how it is configured, built and
 * snapshotted. */
#ifndef COVE_DEVICE_H
#define COVE_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/log.h"
#include "devices/virtio_mmio.h"
#include "vmm/vm_host.h"

/* A device's configuration, as its type parses it from an option or the machine config. */
#define DEVICE_CFG_BYTES 64
struct device_spec {
	const struct device_type *type;
	_Alignas(8) unsigned char cfg[DEVICE_CFG_BYTES];
};

/* What a device gets from the machine: its services (real or a unit test's fakes) and its place. */
struct device_host {
	const struct vm_host *host;
	uint64_t mmio_base;
	uint32_t irq;
	int index; /* devices of this type already on the board (vda, vdb...) */
};

struct device_type {
	const char *name; /* also its "type" in the machine config's "devices" */
	/* `cove run --OPT[=ARG]` adds one (NULL: no option; built from other options). */
	const char *opt_name;
	const char *opt_help; /* usage lines, each "  --opt ...\n" */
	int (*opt_parse)(const char *arg, void *cfg, char *err, size_t errlen);
	/* The saved machine config: no host paths (restore takes those from its command line). */
	json_t *(*spec_to_json)(const void *cfg);
	int (*spec_from_json)(json_t *j, void *cfg, char *err, size_t errlen);

	size_t size; /* bytes of the device object the board allocates */
	/* 0 or -errno after one log line; `cfg` is the type's own config struct. */
	int (*create)(void *dev, const struct device_host *h, const void *cfg);
	void (*destroy)(void *dev);
	struct virtio_mmio *(*mmio)(void *dev);
	/* Snapshots (NULL: nothing to do). quiesce: finish in-flight work, vCPUs paused. */
	void (*quiesce)(void *dev);
	/* Transport state to save (NULL: virtio_mmio_save). */
	void (*save_mmio)(void *dev, struct virtio_mmio_state *st);
	/* The device's own plain state struct beyond the transport (state_size 0: none). */
#define DEVICE_STATE_MAX 256
	size_t state_size;
	void (*save)(void *dev, void *st);
	/* Checks everything before taking any of it: 0 or -EINVAL with a reason in `err`. */
	int (*restore)(void *dev, const void *st, char *err, size_t errlen);
	/* After a restore, just before the vCPUs start. */
	void (*resumed)(void *dev, struct logger *log);
};

/* NULL-terminated, in the order devices take virtio-mmio slots at equal rank. */
extern const struct device_type *const device_types[];
/* The type called `name`, or NULL. */
const struct device_type *device_type_find(const char *name);

#endif
