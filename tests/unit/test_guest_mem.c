/* Unit tests for vmm/guest_mem: the memory layout around the MMIO hole and pointer checks. */
#include "helpers.h"
#include "vmm/guest_mem.h"

/* RAM split around the MMIO hole: the slots (address, size, memfd offset) for each RAM size. */
static void test_mem_layout(void **state)
{
	(void)state;
	static const struct {
		uint64_t size;
		int r;
		uint32_t n;
		struct mem_slot s[MEM_MAX_SLOTS];
	} cases[] = {
	    {256ULL << 20, 0, 1, {{.gpa = 0, .size = 256ULL << 20}}},
	    {MMIO_HOLE_START, 0, 1, {{.gpa = 0, .size = MMIO_HOLE_START}}},
	    {4ULL << 30,
	     0,
	     2,
	     {{.gpa = 0, .size = MMIO_HOLE_START},
	      {.gpa = 1ULL << 32,
	       .size = (4ULL << 30) - MMIO_HOLE_START,
	       .file_off = MMIO_HOLE_START}}},
	    {0, -EINVAL, 0, {{0}}},
	    {(256ULL << 20) + 1, -EINVAL, 0, {{0}}},
	    {MEM_MAX_SIZE + PAGE_SIZE, -EINVAL, 0, {{0}}},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct mem_slot s[MEM_MAX_SLOTS];
		uint32_t n;
		assert_int_equal(guest_mem_layout(cases[i].size, s, &n), cases[i].r);
		if (cases[i].r)
			continue;
		assert_int_equal(n, cases[i].n);
		for (uint32_t k = 0; k < n; k++) {
			assert_int_equal(s[k].gpa, cases[i].s[k].gpa);
			assert_int_equal(s[k].size, cases[i].s[k].size);
			assert_int_equal(s[k].file_off, cases[i].s[k].file_off);
		}
	}
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
	    cmocka_unit_test(test_mem_layout),
	    cmocka_unit_test(test_mem_ptr_checks),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
