/*
 * CPU templates: allowlists over KVM's supported CPUID. A feature register a template covers
 * keeps only the bits the template allows (and this host offers); the guest then boots, and
 * every restore of its chain runs, with no more than that, whatever the host has beyond it.
 */
#include "vmm/cpu_template.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

#define BIT(n) (1u << (n))

/* One feature register of one CPUID leaf and the bits a template lets through. */
struct reg_allow {
	uint32_t function, index;
	int reg; /* 0 EAX, 1 EBX, 2 ECX, 3 EDX */
	uint32_t allow;
};

/*
 * baseline-v2: x86-64-v2 (SSE3, SSSE3, SSE4.1/4.2, POPCNT, CX16, LAHF/SAHF) plus AES-NI,
 * PCLMULQDQ and RDRAND, which every x86-64 server CPU of the last ten years has; no XSAVE (as
 * v2: the guest keeps its x87/SSE state with FXSAVE, and every XSAVE leaf is empty); the
 * speculation-control bits as this host has them, so a guest's mitigations stay on. Hidden,
 * among others: AVX/AVX2/AVX-512, FMA, F16C, BMI1/2, ADX, MOVBE, LZCNT (abm), PCID/INVPCID,
 * TSC_ADJUST, 1 GiB pages, SSE4a, SVM/VMX, invariant TSC (the guest keeps kvm-clock).
 * CPU_TEMPLATES.md lists it bit by bit.
 */
static const struct reg_allow baseline_v2[] = {
    /* sse3 pclmulqdq ssse3 cx16 sse4_1 sse4_2 x2apic popcnt tsc_deadline aes rdrand
     * hypervisor */
    {1, 0, 2,
     BIT(0) | BIT(1) | BIT(9) | BIT(13) | BIT(19) | BIT(20) | BIT(21) | BIT(23) | BIT(24) |
	 BIT(25) | BIT(30) | BIT(31)},
    /* fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr
     * sse sse2 ht */
    {1, 0, 3,
     0x3ffu | BIT(11) | BIT(12) | BIT(13) | BIT(14) | BIT(15) | BIT(16) | BIT(17) | BIT(19) |
	 BIT(23) | BIT(24) | BIT(25) | BIT(26) | BIT(28)},
    /* fsgsbase smep smap */
    {7, 0, 1, BIT(0) | BIT(7) | BIT(20)},
    {7, 0, 2, 0},
    /* md_clear spec_ctrl stibp flush_l1d arch_capabilities ssbd */
    {7, 0, 3, BIT(10) | BIT(26) | BIT(27) | BIT(28) | BIT(29) | BIT(31)},
    {7, 1, 0, 0},
    {7, 1, 1, 0},
    {7, 1, 2, 0},
    {7, 1, 3, 0},
    /* lahf_lm */
    {0x80000001, 0, 2, BIT(0)},
    /* AMD's copies of leaf 1's fpu..fxsr bits, syscall nx rdtscp lm */
    {0x80000001, 0, 3,
     0x3ffu | BIT(11) | BIT(12) | BIT(13) | BIT(14) | BIT(15) | BIT(16) | BIT(17) | BIT(20) |
	 BIT(23) | BIT(24) | BIT(27) | BIT(29)},
    {0x80000007, 0, 3, 0},
    /* amd_ibpb amd_ibrs amd_stibp ibrs/stibp always-on, ibrs preferred, ibrs same mode,
     * amd_ssbd virt_ssbd amd_ssb_no */
    {0x80000008, 0, 1,
     BIT(12) | BIT(14) | BIT(15) | BIT(16) | BIT(17) | BIT(18) | BIT(19) | BIT(24) | BIT(25) |
	 BIT(26)},
    {0x80000021, 0, 0, 0},
};

struct cpu_tpl {
	const char *name;
	const struct reg_allow *regs;
	size_t nregs;
	/* XSAVE hidden: every leaf 0xD subleaf (state components and sizes) reads as zero. */
	bool no_xsave;
};

static const struct cpu_tpl templates[] = {
    {"baseline-v2", baseline_v2, sizeof(baseline_v2) / sizeof(baseline_v2[0]), true},
};

static const struct cpu_tpl *find(const char *name)
{
	for (size_t i = 0; i < sizeof(templates) / sizeof(templates[0]); i++)
		if (name && !strcmp(name, templates[i].name))
			return &templates[i];
	return NULL;
}

bool cpu_template_known(const char *name)
{
	return find(name) != NULL;
}

const char *cpu_template_names(void)
{
	return "baseline-v2";
}

static uint32_t *reg_ptr(struct kvm_cpuid_entry2 *e, int reg)
{
	uint32_t *r[4] = {&e->eax, &e->ebx, &e->ecx, &e->edx};
	return r[reg];
}

int cpu_template_apply(const char *name, struct kvm_cpuid2 *c)
{
	const struct cpu_tpl *t = find(name);
	if (!t)
		return -ENOENT;
	for (uint32_t i = 0; i < c->nent; i++) {
		struct kvm_cpuid_entry2 *e = &c->entries[i];
		bool indexed = e->flags & KVM_CPUID_FLAG_SIGNIFCANT_INDEX;
		for (size_t k = 0; k < t->nregs; k++) {
			const struct reg_allow *a = &t->regs[k];
			if (a->function == e->function && (!indexed || a->index == e->index))
				*reg_ptr(e, a->reg) &= a->allow;
		}
		if (e->function == 0xd && t->no_xsave)
			e->eax = e->ebx = e->ecx = e->edx = 0;
	}
	return 0;
}
