/* Unit tests for vmm/bus: port/MMIO dispatch and registration rules. */
#include "helpers.h"
#include "vmm/bus.h"

struct fake_dev {
	uint64_t last_off;
	uint8_t last_val;
	int reads, writes;
};

static void fake_read(void *opaque, uint64_t off, uint8_t *data, uint32_t len)
{
	struct fake_dev *d = opaque;
	d->reads++;
	d->last_off = off;
	memset(data, 0xab, len);
}

static void fake_write(void *opaque, uint64_t off, const uint8_t *data, uint32_t len)
{
	struct fake_dev *d = opaque;
	(void)len;
	d->writes++;
	d->last_off = off;
	d->last_val = data[0];
}

static const struct io_ops fake_ops = {.name = "fake", .read = fake_read, .write = fake_write};

static void test_bus_dispatch(void **state)
{
	(void)state;
	struct bus b;
	struct fake_dev d1 = {0}, d2 = {0};
	bus_init(&b, "test");
	assert_int_equal(bus_register(&b, 0x3f8, 8, &fake_ops, &d1), 0);
	assert_int_equal(bus_register(&b, 0x60, 5, &fake_ops, &d2), 0);
	uint8_t v = 0x42, out[8];
	assert_int_equal(bus_write(&b, 0x3fb, &v, 1), 0);
	assert_int_equal(d1.writes, 1);
	assert_int_equal(d1.last_off, 3);
	assert_int_equal(d1.last_val, 0x42);
	assert_int_equal(bus_read(&b, 0x64, out, 1), 0);
	assert_int_equal(d2.reads, 1);
	assert_int_equal(d2.last_off, 4);
	assert_int_equal(out[0], 0xab);
	/* Unassigned: reads see all-ones, writes go nowhere. */
	memset(out, 0, sizeof(out));
	assert_int_equal(bus_read(&b, 0x510, out, 4), -ENOENT);
	assert_int_equal(out[0], 0xff);
	assert_int_equal(out[3], 0xff);
	assert_int_equal(bus_write(&b, 0x510, &v, 1), -ENOENT);
	/* An access straddling a range end belongs to nobody. */
	assert_int_equal(bus_read(&b, 0x3fe, out, 4), -ENOENT);
	assert_int_equal(d1.reads, 0);
	/* Bad lengths. */
	assert_int_equal(bus_read(&b, 0x3f8, out, 3), -EINVAL);
	assert_int_equal(bus_read(&b, 0x3f8, out, 0), -EINVAL);
}

static void test_bus_register_rules(void **state)
{
	(void)state;
	struct bus b;
	struct fake_dev d = {0};
	bus_init(&b, "test");
	assert_int_equal(bus_register(&b, 0x1000, 0x100, &fake_ops, &d), 0);
	assert_int_equal(bus_register(&b, 0x10ff, 1, &fake_ops, &d), -EEXIST);
	assert_int_equal(bus_register(&b, 0xf00, 0x101, &fake_ops, &d), -EEXIST);
	assert_int_equal(bus_register(&b, 0x0, 0x10000, &fake_ops, &d), -EEXIST);
	assert_int_equal(bus_register(&b, 0xf00, 0x100, &fake_ops, &d), 0);
	assert_int_equal(bus_register(&b, 0x1100, 0x100, &fake_ops, &d), 0);
	assert_int_equal(bus_register(&b, 0x5000, 0, &fake_ops, &d), -EINVAL);
	assert_int_equal(bus_register(&b, UINT64_MAX, 2, &fake_ops, &d), -EINVAL);
	assert_int_equal(bus_register(&b, 0x5000, 1, NULL, &d), -EINVAL);
	/* Sorted order is kept whatever the registration order. */
	for (size_t i = 1; i < b.nr; i++)
		assert_true(b.ranges[i - 1].base < b.ranges[i].base);
	for (uint64_t i = 0; b.nr < BUS_MAX_RANGES; i++)
		assert_int_equal(bus_register(&b, 0x100000 + i * 0x10, 0x10, &fake_ops, &d), 0);
	assert_int_equal(bus_register(&b, 0x900000, 1, &fake_ops, &d), -ENOSPC);
	assert_non_null(bus_find(&b, 0x100005, 1));
	assert_null(bus_find(&b, 0x50, 1));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_bus_dispatch),
	    cmocka_unit_test(test_bus_register_rules),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
