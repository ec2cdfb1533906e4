/* Unit tests for vmm/guest_mem: the memory layout around the MMIO hole and pointer checks. */
#include "helpers.h"
#include "vmm/guest_mem.h"

static void test_mem_layout_small(void **state)
{
	(void)state;
	struct mem_slot s[MEM_MAX_SLOTS];
	uint32_t n;
	assert_int_equal(guest_mem_layout(256ULL << 20, s, &n), 0);
	assert_int_equal(n, 1);
	assert_int_equal(s[0].gpa, 0);
	assert_int_equal(s[0].size, 256ULL << 20);
	assert_int_equal(guest_mem_layout(MMIO_HOLE_START, s, &n), 0);
	assert_int_equal(n, 1);
}

static void test_mem_layout_hole(void **state)
{
	(void)state;
	struct mem_slot s[MEM_MAX_SLOTS];
	uint32_t n;
	assert_int_equal(guest_mem_layout(4ULL << 30, s, &n), 0);
	assert_int_equal(n, 2);
	assert_int_equal(s[0].gpa, 0);
	assert_int_equal(s[0].size, MMIO_HOLE_START);
	assert_int_equal(s[1].gpa, 1ULL << 32);
	assert_int_equal(s[1].size, (4ULL << 30) - MMIO_HOLE_START);
	assert_int_equal(s[1].file_off, MMIO_HOLE_START);
	assert_int_equal(guest_mem_layout(0, s, &n), -EINVAL);
	assert_int_equal(guest_mem_layout((256ULL << 20) + 1, s, &n), -EINVAL);
	assert_int_equal(guest_mem_layout(MEM_MAX_SIZE + PAGE_SIZE, s, &n), -EINVAL);
}

static void test_mem_ptr_checks(void **state)
{
	(void)state;
	struct guest_mem m;
	assert_int_equal(guest_mem_create(&m, 4ULL << 30), 0);
	assert_non_null(guest_mem_ptr(&m, 0, 4096));
	assert_ptr_equal(guest_mem_ptr(&m, 0x1000, 1), m.host + 0x1000);
	/* Last byte below the hole is RAM; the hole is not; straddling the hole is not. */
	assert_non_null(guest_mem_ptr(&m, MMIO_HOLE_START - 1, 1));
	assert_null(guest_mem_ptr(&m, MMIO_HOLE_START - 1, 2));
	assert_null(guest_mem_ptr(&m, MMIO_HOLE_START, 1));
	assert_null(guest_mem_ptr(&m, 0xfee00000, 4));
	/* Above 4 GiB maps to the memfd right after low RAM. */
	assert_ptr_equal(guest_mem_ptr(&m, 1ULL << 32, 8), m.host + MMIO_HOLE_START);
	assert_non_null(guest_mem_ptr(&m, guest_mem_end(&m) - 8, 8));
	assert_null(guest_mem_ptr(&m, guest_mem_end(&m) - 8, 9));
	/* Lengths and addresses chosen to wrap 64-bit arithmetic. */
	assert_null(guest_mem_ptr(&m, 0x1000, UINT64_MAX));
	assert_null(guest_mem_ptr(&m, UINT64_MAX, 2));
	assert_null(guest_mem_ptr(&m, UINT64_MAX - 0xfff, 0x2000));
	assert_int_equal(guest_mem_page_index(&m, 1ULL << 32), (int64_t)(MMIO_HOLE_START >> 12));
	assert_int_equal(guest_mem_page_index(&m, MMIO_HOLE_START), -1);
	guest_mem_destroy(&m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_mem_layout_small),
	    cmocka_unit_test(test_mem_layout_hole),
	    cmocka_unit_test(test_mem_ptr_checks),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
