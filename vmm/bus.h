/* Address-range buses (port I/O and MMIO) that devices register on; the core never names a device. */
#ifndef COVE_BUS_H
#define COVE_BUS_H

#include <stddef.h>
#include <stdint.h>

/*
 * A device's handlers for one registered range.  `offset` is relative to the
 * range base; `len` is 1, 2, 4 or 8.  Handlers run on vCPU threads and must do
 * their own locking.  A read handler fills all `len` bytes of `data`.
 */
struct io_ops {
	const char *name;
	void (*read)(void *opaque, uint64_t offset, uint8_t *data, uint32_t len);
	void (*write)(void *opaque, uint64_t offset, const uint8_t *data, uint32_t len);
};

struct io_range {
	uint64_t base;
	uint64_t len;
	const struct io_ops *ops;
	void *opaque;
};

#define BUS_MAX_RANGES 64

/* Ranges are registered before vCPUs start and never change afterwards, so lookups take no lock. */
struct bus {
	const char *name;
	struct io_range ranges[BUS_MAX_RANGES]; /* sorted by base, non-overlapping */
	size_t nr;
};

void bus_init(struct bus *bus, const char *name);
/* Returns 0, -EINVAL (empty or wrapping range), -EEXIST (overlap) or -ENOSPC. */
int bus_register(struct bus *bus, uint64_t base, uint64_t len, const struct io_ops *ops,
		 void *opaque);
const struct io_range *bus_find(const struct bus *bus, uint64_t addr, uint32_t len);
/*
 * Dispatches an access.  Returns 0 when a device handled it, -ENOENT when no
 * range covers [addr, addr+len) (reads then see all-ones), -EINVAL for a bad length.
 */
int bus_read(const struct bus *bus, uint64_t addr, uint8_t *data, uint32_t len);
int bus_write(const struct bus *bus, uint64_t addr, const uint8_t *data, uint32_t len);

#endif
