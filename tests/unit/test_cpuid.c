/* Unit tests for vmm/cpuid: the per-vCPU fields, and the KVM features a snapshotting VMM hides. */
#include "helpers.h"

#include <asm/kvm_para.h>

#include "vmm/cpuid.h"

static struct kvm_cpuid2 *base_with(uint32_t n, const struct kvm_cpuid_entry2 *e)
{
	struct kvm_cpuid2 *c = calloc(1, sizeof(*c) + n * sizeof(c->entries[0]));
	assert_non_null(c);
	c->nent = n;
	memcpy(c->entries, e, n * sizeof(*e));
	return c;
}

/* Async page faults are off (their completions cannot be snapshotted); other PV features stay. */
static void test_no_async_pf(void **state)
{
	(void)state;
	struct kvm_cpuid_entry2 e[] = {
		{.function = KVM_CPUID_FEATURES, .eax = 0xffffffffu, .edx = 0x1u},
	};
	struct kvm_cpuid2 *base = base_with(1, e);
	struct kvm_cpuid2 *c = cpuid_for_vcpu(base, 0, 1);
	assert_non_null(c);
	uint32_t apf = (1u << KVM_FEATURE_ASYNC_PF) | (1u << KVM_FEATURE_ASYNC_PF_VMEXIT) |
		       (1u << KVM_FEATURE_ASYNC_PF_INT);
	assert_int_equal(c->entries[0].eax & apf, 0);
	assert_int_equal(c->entries[0].eax | apf, 0xffffffffu);
	assert_true(c->entries[0].eax & (1u << KVM_FEATURE_CLOCKSOURCE2));
	assert_int_equal(c->entries[0].edx, 0x1u);
	/* The base the other vCPUs copy from is left alone. */
	assert_int_equal(base->entries[0].eax, 0xffffffffu);
	free(c);
	free(base);
}

/* Leaf 1 carries the vCPU's APIC ID, the count, and the hypervisor bit; 0xb its x2APIC ID. */
static void test_per_vcpu_ids(void **state)
{
	(void)state;
	struct kvm_cpuid_entry2 e[] = {
		{.function = 1, .ebx = 0xabcd1234u},
		{.function = 0xb, .edx = 0},
	};
	struct kvm_cpuid2 *base = base_with(2, e);
	struct kvm_cpuid2 *c = cpuid_for_vcpu(base, 3, 4);
	assert_non_null(c);
	assert_int_equal(c->entries[0].ebx, 0x03041234u);
	assert_true(c->entries[0].ecx & (1u << 31));
	assert_true(c->entries[0].edx & (1u << 28));
	assert_int_equal(c->entries[1].edx, 3);
	free(c);
	free(base);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_no_async_pf),
		cmocka_unit_test(test_per_vcpu_ids),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
