/* Address-range buses: sorted, non-overlapping ranges looked up by binary search. */
#include "vmm/bus.h"

#include <errno.h>
#include <string.h>

void bus_init(struct bus *bus, const char *name)
{
	memset(bus, 0, sizeof(*bus));
	bus->name = name;
}

int bus_register(struct bus *bus, uint64_t base, uint64_t len, const struct io_ops *ops,
		 void *opaque)
{
	if (len == 0 || base + len < base || !ops)
		return -EINVAL;
	if (bus->nr >= BUS_MAX_RANGES)
		return -ENOSPC;
	size_t pos = 0;
	while (pos < bus->nr && bus->ranges[pos].base < base)
		pos++;
	/* Neighbours on either side must not overlap [base, base+len). */
	if (pos > 0) {
		const struct io_range *prev = &bus->ranges[pos - 1];
		if (prev->base + prev->len > base)
			return -EEXIST;
	}
	if (pos < bus->nr && bus->ranges[pos].base < base + len)
		return -EEXIST;
	memmove(&bus->ranges[pos + 1], &bus->ranges[pos], (bus->nr - pos) * sizeof(bus->ranges[0]));
	bus->ranges[pos] = (struct io_range){ .base = base, .len = len, .ops = ops, .opaque = opaque };
	bus->nr++;
	return 0;
}

const struct io_range *bus_find(const struct bus *bus, uint64_t addr, uint32_t len)
{
	size_t lo = 0, hi = bus->nr;
	if (len == 0 || addr + len < addr)
		return NULL;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct io_range *r = &bus->ranges[mid];
		if (addr < r->base) {
			hi = mid;
		} else if (addr - r->base >= r->len) {
			lo = mid + 1;
		} else {
			/* An access straddling the end of a range is not the device's. */
			if (addr + len - r->base > r->len)
				return NULL;
			return r;
		}
	}
	return NULL;
}

static int check_len(uint32_t len)
{
	return (len == 1 || len == 2 || len == 4 || len == 8) ? 0 : -EINVAL;
}

int bus_read(const struct bus *bus, uint64_t addr, uint8_t *data, uint32_t len)
{
	if (check_len(len))
		return -EINVAL;
	const struct io_range *r = bus_find(bus, addr, len);
	if (!r || !r->ops->read) {
		memset(data, 0xff, len);
		return -ENOENT;
	}
	r->ops->read(r->opaque, addr - r->base, data, len);
	return 0;
}

int bus_write(const struct bus *bus, uint64_t addr, const uint8_t *data, uint32_t len)
{
	if (check_len(len))
		return -EINVAL;
	const struct io_range *r = bus_find(bus, addr, len);
	if (!r || !r->ops->write)
		return -ENOENT;
	r->ops->write(r->opaque, addr - r->base, data, len);
	return 0;
}
