/* Unit tests for vmm/mptable: the MP floating pointer and table checksums and entries. */
#include "helpers.h"
#include "vmm/guest_mem.h"
#include "vmm/mptable.h"
#include "vmm/x86_boot.h"

/* Sum of every byte of an MP structure is zero. */
static uint8_t sum8(const uint8_t *p, size_t n)
{
	uint8_t s = 0;
	for (size_t i = 0; i < n; i++)
		s += p[i];
	return s;
}

static void test_mptable(void **state)
{
	(void)state;
	struct guest_mem m;
	assert_int_equal(guest_mem_create(&m, 16ULL << 20), 0);
	assert_int_equal(mptable_write(&m, 4), 0);
	const uint8_t *mpf = m.host + BOOT_MPTABLE_ADDR;
	assert_memory_equal(mpf, "_MP_", 4);
	assert_int_equal(sum8(mpf, 16), 0);
	uint32_t phys;
	memcpy(&phys, mpf + 4, 4);
	const uint8_t *tbl = m.host + phys;
	assert_memory_equal(tbl, "PCMP", 4);
	uint16_t tlen;
	memcpy(&tlen, tbl + 4, 2);
	assert_int_equal(sum8(tbl, tlen), 0);
	/* Entries: 4 CPUs (first is the BSP), then bus, IOAPIC, 16 IRQs, 2 local interrupts. */
	const uint8_t *p = tbl + 44;
	for (int i = 0; i < 4; i++, p += 20) {
		assert_int_equal(p[0], 0);
		assert_int_equal(p[1], i);
		assert_int_equal(p[3], i == 0 ? 3 : 1);
	}
	assert_int_equal(p[0], 1);
	p += 8;
	assert_int_equal(p[0], 2);
	assert_int_equal(p[1], 4); /* IOAPIC ID after the CPUs' */
	p += 8;
	assert_int_equal(p[0], 3);
	assert_int_equal(p[7], 2); /* ISA IRQ 0 (PIT) -> IOAPIC pin 2, as KVM routes it */
	assert_int_equal(tbl + tlen, p + 16 * 8 + 2 * 8);
	assert_int_equal(mptable_write(&m, 0), -EINVAL);
	assert_int_equal(mptable_write(&m, 255), -EINVAL);
	guest_mem_destroy(&m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_mptable),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
