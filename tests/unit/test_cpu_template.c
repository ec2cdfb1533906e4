/*
 * Unit tests for vmm/cpu_template: what baseline-v2 leaves of the KVM box's real CPUID, and the
 * rule it exists for, run through snapshot/cpu_compat on real lists: a guest that saw the
 * template restores on a host with fewer features outside it, both ways, while a guest that saw
 * everything is refused there by the feature's name.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "cpu_lists.h"
#include "snapshot/cpu_compat.h"
#include "vmm/cpu_template.h"

#define N(a) (sizeof(a) / sizeof((a)[0]))

/* A kvm_cpuid2 holding a copy of the box's supported CPUID. */
static struct kvm_cpuid2 *box_copy(void)
{
	struct kvm_cpuid2 *c = calloc(1, sizeof(*c) + sizeof(box_cpuid));
	assert_non_null(c);
	c->nent = N(box_cpuid);
	memcpy(c->entries, box_cpuid, sizeof(box_cpuid));
	return c;
}

static struct kvm_cpuid_entry2 *leaf(struct kvm_cpuid2 *c, uint32_t fn, uint32_t idx)
{
	for (uint32_t i = 0; i < c->nent; i++)
		if (c->entries[i].function == fn &&
		    (!(c->entries[i].flags & KVM_CPUID_FLAG_SIGNIFCANT_INDEX) ||
		     c->entries[i].index == idx))
			return &c->entries[i];
	return NULL;
}

/* cpu_compat_check of a guest that saw `seen` on a host offering `host` (no MSR question). */
static int compat(const struct kvm_cpuid2 *seen, const struct kvm_cpuid2 *host, char *err,
		  size_t errlen)
{
	struct kvm_msr_entry m = {.index = 0x10, .data = 1}, keep[1];
	uint32_t h = 0x10, nkeep;
	struct cpu_compat_in in = {.vcpu = 0,
				   .msrs = &m,
				   .nmsrs = 1,
				   .host_msrs = &h,
				   .nhost_msrs = 1,
				   .cpuid = seen->entries,
				   .ncpuid = seen->nent,
				   .host_cpuid = host->entries,
				   .nhost_cpuid = host->nent};
	err[0] = '\0';
	return cpu_compat_check(&in, keep, &nkeep, NULL, NULL, err, errlen);
}

static void test_names(void **state)
{
	(void)state;
	assert_true(cpu_template_known("baseline-v2"));
	assert_false(cpu_template_known(""));
	assert_false(cpu_template_known("baseline-v3"));
	assert_false(cpu_template_known(NULL));
	assert_string_equal(cpu_template_names(), "baseline-v2");
	struct kvm_cpuid2 *c = box_copy();
	assert_int_equal(cpu_template_apply("T2", c), -ENOENT);
	assert_memory_equal(c->entries, box_cpuid, sizeof(box_cpuid));
	free(c);
}

/* What the box's EPYC keeps and loses under baseline-v2. */
static void test_baseline_v2_bits(void **state)
{
	(void)state;
	struct kvm_cpuid2 *c = box_copy();
	struct kvm_cpuid_entry2 before7 = *leaf(c, 7, 0), before1 = *leaf(c, 1, 0);
	/* The box offers what the template hides: otherwise this test shows nothing. */
	assert_true(before7.ebx & (1u << 8));  /* bmi2 */
	assert_true(before7.ebx & (1u << 3));  /* bmi1 */
	assert_true(before1.ecx & (1u << 22)); /* movbe */
	assert_int_equal(cpu_template_apply("baseline-v2", c), 0);
	assert_int_equal(c->nent, N(box_cpuid));

	const struct kvm_cpuid_entry2 *l1 = leaf(c, 1, 0), *l7 = leaf(c, 7, 0);
	/* kept: sse3 pclmulqdq ssse3 cx16 sse4_1 sse4_2 popcnt aes */
	const uint32_t v2 = (1u << 0) | (1u << 1) | (1u << 9) | (1u << 13) | (1u << 19) |
			    (1u << 20) | (1u << 23) | (1u << 25);
	assert_int_equal(l1->ecx & v2, before1.ecx & v2);
	assert_int_equal(l1->ecx & v2, v2);
	/* hidden: movbe fma avx f16c */
	assert_int_equal(l1->ecx & ((1u << 22) | (1u << 12) | (1u << 28) | (1u << 29)), 0);
	assert_int_equal(l1->edx, before1.edx & l1->edx);
	assert_true(l1->edx & (1u << 26)); /* sse2 */
	/* leaf 7: only fsgsbase, smep, smap; bmi1/2, avx2, adx, clflushopt gone */
	assert_int_equal(l7->ebx & ~((1u << 0) | (1u << 7) | (1u << 20)), 0);
	assert_int_equal(l7->ecx, 0);
	/* No XSAVE (x86-64-v2): the bit gone, every 0xD subleaf empty, though the box has it */
	assert_true(before1.ecx & (1u << 26));
	assert_int_equal(l1->ecx & ((1u << 26) | (1u << 27)), 0);
	int n0xd = 0;
	for (uint32_t i = 0; i < c->nent; i++)
		if (c->entries[i].function == 0xd) {
			n0xd++;
			assert_int_equal(c->entries[i].eax | c->entries[i].ebx | c->entries[i].ecx |
					     c->entries[i].edx,
					 0);
		}
	assert_true(n0xd >= 3);
	const struct kvm_cpuid_entry2 *e1 = leaf(c, 0x80000001, 0);
	assert_non_null(e1);
	assert_int_equal(e1->ecx & ~1u, 0); /* lahf_lm only: no svm, abm, sse4a, cr8_legacy */
	assert_true(e1->edx & (1u << 29));  /* lm */
	assert_int_equal(e1->edx & (1u << 26), 0); /* pdpe1gb */
	/* Leaves the template does not cover pass through: the vendor, the KVM leaf. */
	assert_memory_equal(leaf(c, 0, 0), &box_cpuid[0], sizeof(box_cpuid[0]));
	/* Applying it twice changes nothing more. */
	struct kvm_cpuid2 *again = box_copy();
	assert_int_equal(cpu_template_apply("baseline-v2", again), 0);
	assert_int_equal(cpu_template_apply("baseline-v2", again), 0);
	assert_memory_equal(again->entries, c->entries, sizeof(box_cpuid));
	free(again);
	free(c);
}

/*
 * The box's EPYC ("big") and the same without bmi2 and adx ("small", as kvm-box --cpu
 * EPYC,...,-bmi2 gives): under the template a chain moves both ways; without it the move to
 * the small one is refused naming what the guest saw, and the move up is fine.
 */
static void test_moves(void **state)
{
	(void)state;
	char err[1024];
	struct kvm_cpuid2 *big = box_copy(), *small = box_copy();
	leaf(small, 7, 0)->ebx &= ~((1u << 8) | (1u << 19));

	/* No template: the guest saw bmi2 and adx on the big host. */
	assert_int_equal(compat(big, small, err, sizeof(err)), -ENOEXEC);
	assert_non_null(strstr(err, "CPUID 0x7.0 EBX bit 8 bmi2 not offered here"));
	assert_non_null(strstr(err, "CPUID 0x7.0 EBX bit 19 adx not offered here"));
	assert_int_equal(compat(small, big, err, sizeof(err)), 0);

	/* baseline-v2 on both sides (a chain records it; every restore applies it again). */
	struct kvm_cpuid2 *tbig = box_copy(), *tsmall = box_copy();
	memcpy(tsmall->entries, small->entries, sizeof(box_cpuid));
	assert_int_equal(cpu_template_apply("baseline-v2", tbig), 0);
	assert_int_equal(cpu_template_apply("baseline-v2", tsmall), 0);
	assert_int_equal(compat(tbig, tsmall, err, sizeof(err)), 0);
	assert_int_equal(compat(tsmall, tbig, err, sizeof(err)), 0);
	/* A templated chain also restores where the host offers everything (no template). */
	assert_int_equal(compat(tbig, small, err, sizeof(err)), 0);

	/* A feature inside the baseline that a host lacks is still refused by name. */
	leaf(tsmall, 1, 0)->ecx &= ~(1u << 25);
	assert_int_equal(compat(tbig, tsmall, err, sizeof(err)), -ENOEXEC);
	assert_non_null(strstr(err, "CPUID 0x1.0 ECX bit 25 aes not offered here"));
	free(big);
	free(small);
	free(tbig);
	free(tsmall);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_names),
	    cmocka_unit_test(test_baseline_v2_bits),
	    cmocka_unit_test(test_moves),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
