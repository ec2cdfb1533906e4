/* The CPU-state rule: can this host take a chain's MSRs and CPUID? Pure, see CPU_COMPAT.md. */
#include "snapshot/cpu_compat.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "common/byteorder.h"
#include "common/errmsg.h"

#define ALL (~(uint64_t)0)

/*
 * Every MSR some KVM lists in KVM_GET_MSR_INDEX_LIST that a chain may hold, with what to do
 * when this host's KVM cannot set it. CPU_COMPAT.md gives each reason in full; keep the two in
 * step. EFER and the APIC base are not here: they travel in KVM_GET/SET_SREGS on every host.
 */
static const struct msr_rule msr_table[] = {
    /* The guest's system-call entry points and per-CPU base: lose one and the next syscall,
     * sysenter or swapgs jumps to or loads a wrong address. */
    {0x174, 0x174, "IA32_SYSENTER_CS", MSR_REFUSE, 0, 0, "32-bit sysenter entry the guest set"},
    {0x175, 0x175, "IA32_SYSENTER_ESP", MSR_REFUSE, 0, 0, "32-bit sysenter entry the guest set"},
    {0x176, 0x176, "IA32_SYSENTER_EIP", MSR_REFUSE, 0, 0, "32-bit sysenter entry the guest set"},
    {0xc0000081, 0xc0000081, "STAR", MSR_REFUSE, 0, 0, "syscall segments the guest set"},
    {0xc0000082, 0xc0000082, "LSTAR", MSR_REFUSE, 0, 0, "64-bit syscall entry the guest set"},
    {0xc0000083, 0xc0000083, "CSTAR", MSR_REFUSE, 0, 0, "compat syscall entry the guest set"},
    {0xc0000084, 0xc0000084, "SYSCALL_MASK", MSR_REFUSE, 0, 0,
     "RFLAGS mask on syscall (IF, TF, AC, DF) the guest set"},
    {0xc0000102, 0xc0000102, "KERNEL_GS_BASE", MSR_REFUSE, 0, 0,
     "the per-CPU base swapgs exchanges"},
    /* Time. */
    {0x10, 0x10, "IA32_TSC", MSR_REFUSE, 0, 0,
     "the guest's TSC: without it the TSC restarts near 0 and TSC-based time goes back"},
    {0x3b, 0x3b, "IA32_TSC_ADJUST", MSR_DROP_IF_RESET, 0, ALL,
     "a guest that finds it changed writes it back, which moves its TSC"},
    {0x6e0, 0x6e0, "IA32_TSC_DEADLINE", MSR_DROP_IF_RESET, 0, ALL,
     "an armed LAPIC timer: dropped, its interrupt never comes"},
    {0xc0000103, 0xc0000103, "TSC_AUX", MSR_DROP_IF_RESET, 0, ALL,
     "the CPU number RDTSCP/RDPID return (vgetcpu); 0 is vCPU 0's"},
    {0xc0000104, 0xc0000104, "AMD64_TSC_RATIO", MSR_DROP_IF_RESET, 1ull << 32, ALL,
     "TSC scaling of the guest's own nested guests"},
    /* kvmclock and the other paravirtual MSRs: each holds a guest address KVM writes to. */
    {0x11, 0x11, "KVM_WALL_CLOCK", MSR_DROP, 0, 0,
     "a one-shot request: KVM writes the wall clock once per guest write, keeps nothing"},
    {0x4b564d00, 0x4b564d00, "KVM_WALL_CLOCK_NEW", MSR_DROP, 0, 0,
     "a one-shot request: KVM writes the wall clock once per guest write, keeps nothing"},
    {0x12, 0x12, "KVM_SYSTEM_TIME", MSR_DROP_IF_RESET, 0, ALL,
     "the guest's kvmclock page: dropped, KVM stops updating it and guest time stalls"},
    {0x4b564d01, 0x4b564d01, "KVM_SYSTEM_TIME_NEW", MSR_DROP_IF_RESET, 0, ALL,
     "the guest's kvmclock page: dropped, KVM stops updating it and guest time stalls"},
    {0x4b564d02, 0x4b564d02, "KVM_ASYNC_PF_EN", MSR_DROP_IF_RESET, 0, ALL,
     "async page faults (cove hides them): a guest waiting on a token would hang"},
    {0x4b564d03, 0x4b564d03, "KVM_STEAL_TIME", MSR_DROP_IF_RESET, 0, ALL,
     "the steal-time page: its preempted flag would stay set for good"},
    {0x4b564d04, 0x4b564d04, "KVM_PV_EOI_EN", MSR_DROP_IF_RESET, 0, ALL,
     "paravirtual EOI: the guest skips EOIs KVM would no longer do, interrupts stop"},
    {0x4b564d05, 0x4b564d05, "KVM_POLL_CONTROL", MSR_DROP, 0, 0,
     "a hint whether the host polls before halting: speed only"},
    {0x4b564d06, 0x4b564d06, "KVM_ASYNC_PF_INT", MSR_DROP_IF_RESET, 0, ALL,
     "the vector of async page-fault completions (cove hides async PF)"},
    {0x4b564d07, 0x4b564d07, "KVM_ASYNC_PF_ACK", MSR_DROP, 0, 0,
     "write-only acknowledgement, reads as 0"},
    {0x4b564d08, 0x4b564d08, "KVM_MIGRATION_CONTROL", MSR_DROP_IF_RESET, 0, ALL,
     "SEV live-migration opt-in"},
    /* Settings the guest writes that change what its CPU does. */
    {0x277, 0x277, "IA32_CR_PAT", MSR_REFUSE, 0, 0, "memory types of the guest's page tables"},
    {0x1a0, 0x1a0, "IA32_MISC_ENABLE", MSR_REFUSE, 0, 0,
     "guest-set bits: fast strings, MWAIT, CPUID limit, XD disable"},
    {0x48, 0x48, "IA32_SPEC_CTRL", MSR_DROP_IF_RESET, 0, ALL,
     "the guest's speculation mitigations (IBRS, STIBP, SSBD) would silently go"},
    {0xc001011f, 0xc001011f, "AMD64_VIRT_SPEC_CTRL", MSR_DROP_IF_RESET, 0, ALL,
     "the guest's SSBD mitigation would silently go"},
    {0x122, 0x122, "IA32_TSX_CTRL", MSR_DROP_IF_RESET, 0, ALL,
     "the guest turned TSX off; dropped, RTM comes back"},
    {0x3a, 0x3a, "IA32_FEAT_CTL", MSR_DROP_IF_RESET, 0, ALL,
     "the guest locked VMX/SGX/LMCE enables"},
    {0x140, 0x140, "MISC_FEATURES_ENABLES", MSR_DROP_IF_RESET, 0, ALL,
     "CPUID faulting a guest task turned on (arch_prctl ARCH_SET_CPUID)"},
    {0xc0010015, 0xc0010015, "K7_HWCR", MSR_DROP_IF_RESET, 0, 1ull << 18,
     "McStatusWrEn (bit 18), the only bit a guest sets; bit 24 describes the host"},
    {0xc0010117, 0xc0010117, "VM_HSAVE_PA", MSR_DROP_IF_RESET, 0, ALL,
     "the host save area of the guest's own SVM guests"},
    {0x1d9, 0x1d9, "IA32_DEBUGCTL", MSR_DROP_IF_RESET, 0, ALL,
     "branch tracing or branch single-step (a debugger's) the guest turned on"},
    {0xda0, 0xda0, "IA32_XSS", MSR_DROP_IF_RESET, 0, ALL, "supervisor XSAVE state in use"},
    {0x1c4, 0x1c4, "IA32_XFD", MSR_DROP_IF_RESET, 0, ALL, "AMX state the guest armed"},
    {0x1c5, 0x1c5, "IA32_XFD_ERR", MSR_DROP_IF_RESET, 0, ALL, "a pending AMX first-use fault"},
    {0xd90, 0xd90, "IA32_BNDCFGS", MSR_DROP_IF_RESET, 0, ALL, "MPX bounds checking in use"},
    {0xe1, 0xe1, "IA32_UMWAIT_CONTROL", MSR_DROP_IF_RESET, 0, ALL, "the guest's UMWAIT time limit"},
    {0x6a0, 0x6a0, "IA32_U_CET", MSR_DROP_IF_RESET, 0, ALL, "user shadow stack / IBT in use"},
    {0x6a2, 0x6a2, "IA32_S_CET", MSR_DROP_IF_RESET, 0, ALL, "kernel shadow stack / IBT in use"},
    {0x6a4, 0x6a8, "IA32_PLx_SSP/INT_SSP_TAB", MSR_DROP_IF_RESET, 0, ALL,
     "shadow-stack pointers in use"},
    {0x9e, 0x9e, "IA32_SMBASE", MSR_DROP_IF_RESET, 0x30000, ALL,
     "the SMM save base (cove runs no SMM code)"},
    {0x17a, 0x17a, "IA32_MCG_STATUS", MSR_DROP_IF_RESET, 0, ALL, "a machine check in progress"},
    {0x17b, 0x17b, "IA32_MCG_CTL", MSR_DROP_IF_RESET, 0, ALL,
     "machine-check reporting (cove never sets KVM up to emulate machine checks)"},
    {0x4d0, 0x4d0, "IA32_MCG_EXT_CTL", MSR_DROP_IF_RESET, 0, ALL, "local machine checks on"},
    /* Records and descriptions: the guest reads them, nothing it does depends on them later. */
    {0x1db, 0x1db, "LASTBRANCHFROMIP", MSR_DROP, 0, 0,
     "a record of the last branch, written by the CPU only: history, not state"},
    {0x1dc, 0x1dc, "LASTBRANCHTOIP", MSR_DROP, 0, 0,
     "a record of the last branch, written by the CPU only: history, not state"},
    {0x1dd, 0x1dd, "LASTINTFROMIP", MSR_DROP, 0, 0,
     "a record of the last exception, written by the CPU only: history, not state"},
    {0x1de, 0x1de, "LASTINTTOIP", MSR_DROP, 0, 0,
     "a record of the last exception, written by the CPU only: history, not state"},
    {0x34, 0x34, "SMI_COUNT", MSR_DROP, 0, 0, "a statistic (SMIs seen)"},
    {0x8b, 0x8b, "IA32_UCODE_REV", MSR_DROP, 0, 0,
     "describes the host's microcode; the guest read it at boot"},
    {0x10a, 0x10a, "IA32_ARCH_CAPABILITIES", MSR_DROP, 0, 0,
     "describes the host CPU; read-only to the guest, which chose its mitigations at boot"},
    {0x345, 0x345, "IA32_PERF_CAPABILITIES", MSR_DROP, 0, 0,
     "describes the PMU; the guest's perf driver read it at boot"},
    {0xce, 0xce, "PLATFORM_INFO", MSR_DROP, 0, 0,
     "describes the host (CPUID faulting support); read-only to the guest"},
    {0x1fc, 0x1fc, "IA32_POWER_CTL", MSR_DROP, 0, 0, "KVM stores it and nothing acts on it"},
    {0x480, 0x493, "IA32_VMX_*", MSR_DROP, 0, 0,
     "VMX capability reports for the guest's own guests; read-only to the guest"},
    /* Performance monitoring: counts may go; an armed event select may not. */
    {0xc1, 0xc8, "IA32_PMCx", MSR_DROP, 0, 0, "a performance count"},
    {0x4c1, 0x4c8, "IA32_A_PMCx", MSR_DROP, 0, 0, "a performance count"},
    {0x309, 0x30b, "FIXED_CTRx", MSR_DROP, 0, 0, "a performance count"},
    {0xc0010004, 0xc0010007, "K7_PERFCTRx", MSR_DROP, 0, 0, "a performance count"},
    {0x186, 0x18d, "IA32_PERFEVTSELx", MSR_DROP_IF_RESET, 0, ALL,
     "an armed counter (perf, the NMI watchdog) would stop"},
    {0x38d, 0x38d, "FIXED_CTR_CTRL", MSR_DROP_IF_RESET, 0, ALL,
     "an armed fixed counter would stop"},
    {0x38e, 0x390, "PERF_GLOBAL_STATUS/CTRL/OVF", MSR_DROP_IF_RESET, 0, ALL,
     "armed counters or a pending overflow would be lost"},
    {0xc0010000, 0xc0010003, "K7_EVNTSELx", MSR_DROP_IF_RESET, 0, ALL,
     "an armed counter (perf, the NMI watchdog) would stop"},
    {0xc0010200, 0xc001020b, "F15H_PERF_CTL/CTRx", MSR_DROP_IF_RESET, 0, ALL,
     "an armed counter (perf, the NMI watchdog) would stop"},
    {0xc0000300, 0xc0000303, "AMD64_PERF_CNTR_GLOBAL_*", MSR_DROP_IF_RESET, 0, ALL,
     "armed counters or a pending overflow would be lost"},
    {0x3f1, 0x3f1, "IA32_PEBS_ENABLE", MSR_DROP_IF_RESET, 0, ALL, "PEBS sampling armed"},
    {0x3f2, 0x3f2, "PEBS_DATA_CFG", MSR_DROP_IF_RESET, 0, ALL, "PEBS sampling configured"},
    {0x600, 0x600, "IA32_DS_AREA", MSR_DROP_IF_RESET, 0, ALL, "a PEBS/BTS buffer set up"},
    /* Hyper-V: cove offers no Hyper-V CPUID leaves. KVM keeps the partition's reference
     * counter and describes the frequencies whether or not a guest looks. */
    {0x40000010, 0x40000010, "HV_X64_VP_RUNTIME", MSR_DROP, 0, 0, "a read-only counter"},
    {0x40000020, 0x40000020, "HV_X64_TIME_REF_COUNT", MSR_DROP, 0, 0,
     "a read-only counter KVM derives from its clock"},
    {0x40000022, 0x40000023, "HV_X64_TSC/APIC_FREQUENCY", MSR_DROP, 0, 0,
     "describes the host; read-only"},
    {0x40000000, 0x400001ff, "HV_X64_*", MSR_DROP_IF_RESET, 0, ALL,
     "Hyper-V enlightenments, which cove does not offer"},
    {0x560, 0x561, "IA32_RTIT_OUTPUT_*", MSR_DROP_IF_RESET, 0, ALL, "Intel PT tracing in use"},
    {0x570, 0x572, "IA32_RTIT_CTL/STATUS/CR3", MSR_DROP_IF_RESET, 0, ALL,
     "Intel PT tracing in use"},
    {0x580, 0x587, "IA32_RTIT_ADDRx", MSR_DROP_IF_RESET, 0, ALL, "Intel PT tracing in use"},
};

const struct msr_rule *cpu_msr_rule(uint32_t index)
{
	for (size_t i = 0; i < sizeof(msr_table) / sizeof(msr_table[0]); i++)
		if (index >= msr_table[i].first && index <= msr_table[i].last)
			return &msr_table[i];
	return NULL;
}

const char *cpu_msr_name(uint32_t index)
{
	const struct msr_rule *r = cpu_msr_rule(index);
	return r ? r->name : NULL;
}

int cpu_msr_droppable(uint32_t index, uint64_t value)
{
	const struct msr_rule *r = cpu_msr_rule(index);
	if (!r)
		return 0;
	if (r->policy == MSR_DROP)
		return 1;
	return r->policy == MSR_DROP_IF_RESET && (value & r->mask) == (r->reset & r->mask);
}

/* A bounded line being built: appends never overrun, a full line ends in "...". */
struct line {
	char *p;
	size_t cap, len;
	unsigned items;
};

static void line_add(struct line *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void line_add(struct line *l, const char *fmt, ...)
{
	if (!l->cap || l->len >= l->cap - 1)
		return;
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(l->p + l->len, l->cap - l->len, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n >= l->cap - l->len) {
		l->len = l->cap - 1;
		if (l->cap > 4)
			memcpy(l->p + l->cap - 4, "...", 4);
	} else {
		l->len += (size_t)n;
	}
}

/* Feature bits a guest may have seen in CPUID, named where a name helps. */
struct cpuid_reg {
	uint32_t function, index;
	int reg;		  /* 0 EAX, 1 EBX, 2 ECX, 3 EDX */
	const char *const *names; /* 32 entries, NULL where unnamed */
};

static const char *const l1_ecx[32] = {
    [0] = "sse3",    [1] = "pclmulqdq",	    [3] = "monitor", [5] = "vmx",
    [9] = "ssse3",   [12] = "fma",	    [13] = "cx16",   [17] = "pcid",
    [19] = "sse4_1", [20] = "sse4_2",	    [21] = "x2apic", [22] = "movbe",
    [23] = "popcnt", [24] = "tsc_deadline", [25] = "aes",    [26] = "xsave",
    [28] = "avx",    [29] = "f16c",	    [30] = "rdrand", [31] = "hypervisor"};
static const char *const l1_edx[32] = {
    [0] = "fpu",  [1] = "vme",	 [2] = "de",	[3] = "pse",   [4] = "tsc",    [5] = "msr",
    [6] = "pae",  [7] = "mce",	 [8] = "cx8",	[9] = "apic",  [11] = "sep",   [12] = "mtrr",
    [13] = "pge", [14] = "mca",	 [15] = "cmov", [16] = "pat",  [17] = "pse36", [19] = "clflush",
    [23] = "mmx", [24] = "fxsr", [25] = "sse",	[26] = "sse2", [27] = "ss",    [28] = "ht"};
static const char *const l6_eax[32] = {[2] = "arat"};
static const char *const l7_ebx[32] = {
    [0] = "fsgsbase",  [1] = "tsc_adjust",  [2] = "sgx",	 [3] = "bmi1",
    [4] = "hle",       [5] = "avx2",	    [7] = "smep",	 [8] = "bmi2",
    [9] = "erms",      [10] = "invpcid",    [11] = "rtm",	 [14] = "mpx",
    [16] = "avx512f",  [17] = "avx512dq",   [18] = "rdseed",	 [19] = "adx",
    [20] = "smap",     [21] = "avx512ifma", [23] = "clflushopt", [24] = "clwb",
    [28] = "avx512cd", [29] = "sha_ni",	    [30] = "avx512bw",	 [31] = "avx512vl"};
static const char *const l7_ecx[32] = {
    [1] = "avx512vbmi",	  [2] = "umip",		  [3] = "pku",
    [5] = "waitpkg",	  [6] = "avx512_vbmi2",	  [7] = "shstk",
    [8] = "gfni",	  [9] = "vaes",		  [10] = "vpclmulqdq",
    [11] = "avx512_vnni", [12] = "avx512_bitalg", [14] = "avx512_vpopcntdq",
    [16] = "la57",	  [22] = "rdpid",	  [25] = "cldemote",
    [27] = "movdiri",	  [28] = "movdir64b"};
static const char *const l7_edx[32] = {
    [4] = "fsrm",	[8] = "avx512_vp2intersect", [10] = "md_clear",
    [14] = "serialize", [16] = "tsxldtrk",	     [20] = "ibt",
    [22] = "amx_bf16",	[23] = "avx512_fp16",	     [24] = "amx_tile",
    [25] = "amx_int8",	[26] = "spec_ctrl",	     [27] = "stibp",
    [28] = "flush_l1d", [29] = "arch_capabilities",  [30] = "core_capabilities",
    [31] = "ssbd"};
static const char *const l7_1_eax[32] = {[4] = "avx_vnni", [5] = "avx512_bf16"};
static const char *const ld_0_eax[32] = {[0] = "x87",
					 [1] = "sse",
					 [2] = "avx",
					 [3] = "mpx_bndregs",
					 [4] = "mpx_bndcsr",
					 [5] = "avx512_opmask",
					 [6] = "avx512_zmm_hi256",
					 [7] = "avx512_hi16_zmm",
					 [9] = "pkru",
					 [17] = "amx_tilecfg",
					 [18] = "amx_tiledata"};
static const char *const ld_1_eax[32] = {
    [0] = "xsaveopt", [1] = "xsavec", [2] = "xgetbv1", [3] = "xsaves", [4] = "xfd"};
static const char *const e1_ecx[32] = {
    [0] = "lahf_lm",  [1] = "cmp_legacy",    [2] = "svm",	  [4] = "cr8_legacy",
    [5] = "abm",      [6] = "sse4a",	     [7] = "misalignsse", [8] = "3dnowprefetch",
    [9] = "osvw",     [11] = "xop",	     [16] = "fma4",	  [21] = "tbm",
    [22] = "topoext", [23] = "perfctr_core", [29] = "mwaitx"};
static const char *const e1_edx[32] = {
    [11] = "syscall", [20] = "nx", [22] = "mmxext",   [25] = "fxsr_opt", [26] = "pdpe1gb",
    [27] = "rdtscp",  [29] = "lm", [30] = "3dnowext", [31] = "3dnow"};
static const char *const e7_edx[32] = {[8] = "invariant_tsc"};
static const char *const e8_ebx[32] = {
    [0] = "clzero",	[2] = "xsaveerptr", [4] = "rdpru",	[9] = "wbnoinvd",
    [12] = "amd_ibpb",	[14] = "amd_ibrs",  [15] = "amd_stibp", [24] = "amd_ssbd",
    [25] = "virt_ssbd", [26] = "amd_ssb_no"};
static const char *const kvm_eax[32] = {
    [0] = "kvm_clocksource",	    [1] = "kvm_nopiodelay",	    [3] = "kvm_clocksource2",
    [4] = "kvm_async_pf",	    [5] = "kvm_steal_time",	    [6] = "kvm_pv_eoi",
    [7] = "kvm_pv_unhalt",	    [9] = "kvm_pv_tlb_flush",	    [10] = "kvm_async_pf_vmexit",
    [11] = "kvm_pv_send_ipi",	    [12] = "kvm_poll_control",	    [13] = "kvm_pv_sched_yield",
    [14] = "kvm_async_pf_int",	    [15] = "kvm_msi_ext_dest_id",   [16] = "kvm_hc_map_gpa_range",
    [17] = "kvm_migration_control", [24] = "kvm_clocksource_stable"};
static const char *const none[32];

static const struct cpuid_reg feature_regs[] = {
    {1, 0, 2, l1_ecx},
    {1, 0, 3, l1_edx},
    {6, 0, 0, l6_eax},
    {7, 0, 1, l7_ebx},
    {7, 0, 2, l7_ecx},
    {7, 0, 3, l7_edx},
    {7, 1, 0, l7_1_eax},
    {7, 1, 3, none},
    {7, 2, 3, none},
    {0xd, 0, 0, ld_0_eax},
    {0xd, 0, 3, none},
    {0xd, 1, 0, ld_1_eax},
    {0xd, 1, 2, none},
    {0xd, 1, 3, none},
    {0x80000001, 0, 2, e1_ecx},
    {0x80000001, 0, 3, e1_edx},
    {0x80000007, 0, 3, e7_edx},
    {0x80000008, 0, 1, e8_ebx},
    {0x80000021, 0, 0, none},
    {0x40000001, 0, 0, kvm_eax},
};

static const struct kvm_cpuid_entry2 *cpuid_find(const struct kvm_cpuid_entry2 *e, uint32_t n,
						 uint32_t function, uint32_t index)
{
	for (uint32_t i = 0; i < n; i++)
		if (e[i].function == function &&
		    (!(e[i].flags & KVM_CPUID_FLAG_SIGNIFCANT_INDEX) || e[i].index == index))
			return &e[i];
	return NULL;
}

static uint32_t reg_of(const struct kvm_cpuid_entry2 *e, int reg)
{
	const uint32_t r[4] = {e->eax, e->ebx, e->ecx, e->edx};
	return r[reg];
}

static void vendor_of(const struct kvm_cpuid_entry2 *e, char out[13])
{
	memcpy(out, &e->ebx, 4);
	memcpy(out + 4, &e->edx, 4);
	memcpy(out + 8, &e->ecx, 4);
	out[12] = 0;
	for (int i = 0; i < 12; i++)
		if (out[i] < 0x20 || out[i] > 0x7e)
			out[i] = '?';
}

/* Features the guest saw that this host does not offer; each added to `bad` by name. */
static void check_cpuid(const struct cpu_compat_in *in, struct line *bad)
{
	static const char regname[4][4] = {"EAX", "EBX", "ECX", "EDX"};
	const struct kvm_cpuid_entry2 *g0 = cpuid_find(in->cpuid, in->ncpuid, 0, 0);
	const struct kvm_cpuid_entry2 *h0 = cpuid_find(in->host_cpuid, in->nhost_cpuid, 0, 0);
	if (g0) {
		char gv[13], hv[13] = "none";
		vendor_of(g0, gv);
		if (h0)
			vendor_of(h0, hv);
		/* The guest chose vendor-specific code at boot (syscall paths, errata, MSRs). */
		if (!h0 || memcmp(gv, hv, 12)) {
			line_add(bad, "%sCPUID 0x0 vendor %s (this host: %s)",
				 bad->items++ ? "; " : "", gv, hv);
		}
	}
	for (size_t k = 0; k < sizeof(feature_regs) / sizeof(feature_regs[0]); k++) {
		const struct cpuid_reg *f = &feature_regs[k];
		const struct kvm_cpuid_entry2 *g =
		    cpuid_find(in->cpuid, in->ncpuid, f->function, f->index);
		if (!g)
			continue;
		const struct kvm_cpuid_entry2 *h =
		    cpuid_find(in->host_cpuid, in->nhost_cpuid, f->function, f->index);
		uint32_t missing = reg_of(g, f->reg) & ~(h ? reg_of(h, f->reg) : 0);
		for (int bit = 0; bit < 32; bit++) {
			if (!(missing & (1u << bit)))
				continue;
			line_add(bad, "%sCPUID 0x%x.%u %s bit %d %s not offered here",
				 bad->items++ ? "; " : "", f->function, f->index, regname[f->reg],
				 bit, f->names[bit] ? f->names[bit] : "(unnamed)");
		}
	}
}

static bool host_has(const struct cpu_compat_in *in, uint32_t index)
{
	for (uint32_t k = 0; k < in->nhost_msrs; k++)
		if (in->host_msrs[k] == index)
			return true;
	return false;
}

static void note_line(cpu_compat_note_fn note, void *ctx, int warn, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void note_line(cpu_compat_note_fn note, void *ctx, int warn, const char *fmt, ...)
{
	if (!note)
		return;
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	note(ctx, warn, buf);
}

int cpu_compat_check(const struct cpu_compat_in *in, struct kvm_msr_entry *keep, uint32_t *nkeep,
		     cpu_compat_note_fn note, void *ctx, char *err, size_t errlen)
{
	char badbuf[1024];
	struct line bad = {badbuf, sizeof(badbuf), 0, 0};
	badbuf[0] = 0;
	*nkeep = 0;

	for (uint32_t i = 0; i < in->nmsrs; i++) {
		const struct kvm_msr_entry *e = &in->msrs[i];
		for (uint32_t k = 0; k < i; k++)
			if (in->msrs[k].index == e->index)
				return errmsg(err, errlen, -EINVAL,
					      "state file: vCPU %u MSR 0x%x is listed twice",
					      in->vcpu, e->index);
		if (host_has(in, e->index)) {
			keep[(*nkeep)++] = *e;
			continue;
		}
		const struct msr_rule *r = cpu_msr_rule(e->index);
		if (cpu_msr_droppable(e->index, e->data)) {
			note_line(
			    note, ctx, 1,
			    "vCPU %u: MSR 0x%x %s dropped (this host's KVM does not save it): "
			    "%s%s",
			    in->vcpu, e->index, r->name,
			    r->policy == MSR_DROP ? "" : "it holds its reset value; ", r->why);
			continue;
		}
		if (!r)
			line_add(&bad, "%sMSR 0x%x = 0x%llx (not in cove's table)",
				 bad.items++ ? "; " : "", e->index, (unsigned long long)e->data);
		else if (r->policy == MSR_REFUSE)
			line_add(&bad, "%sMSR 0x%x %s (%s)", bad.items++ ? "; " : "", e->index,
				 r->name, r->why);
		else
			line_add(&bad, "%sMSR 0x%x %s = 0x%llx, not its reset value 0x%llx (%s)",
				 bad.items++ ? "; " : "", e->index, r->name,
				 (unsigned long long)e->data, (unsigned long long)r->reset, r->why);
	}

	/* The other way: these start at KVM's reset value, which a guest that never saw them has.
	 */
	char hostbuf[512];
	struct line only = {hostbuf, sizeof(hostbuf), 0, 0};
	hostbuf[0] = 0;
	for (uint32_t k = 0; k < in->nhost_msrs; k++) {
		bool in_chain = false;
		for (uint32_t i = 0; i < in->nmsrs && !in_chain; i++)
			in_chain = in->msrs[i].index == in->host_msrs[k];
		if (in_chain)
			continue;
		const char *name = cpu_msr_name(in->host_msrs[k]);
		line_add(&only, "%s0x%x%s%s", only.items++ ? ", " : "", in->host_msrs[k],
			 name ? " " : "", name ? name : "");
	}
	if (only.items)
		note_line(note, ctx, 0,
			  "vCPU %u: %u MSRs this host saves are not in the chain and keep KVM's "
			  "reset value: %s",
			  in->vcpu, only.items, hostbuf);

	if (!in->cpuid)
		note_line(note, ctx, 1,
			  "vCPU %u: the chain recorded no CPUID (an older state file): CPUID check "
			  "skipped",
			  in->vcpu);
	else
		check_cpuid(in, &bad);

	if (bad.items)
		return errmsg(err, errlen, -ENOEXEC,
			      "this host cannot take vCPU %u's CPU state: %s", in->vcpu, badbuf);
	return 0;
}

int cpu_compat_xsave(uint32_t vcpu, uint8_t *xsave, size_t len, uint64_t xcr0, uint64_t cr4,
		     uint64_t host_xfeatures, cpu_compat_note_fn note, void *ctx, char *err,
		     size_t errlen)
{
	const uint64_t fp_sse = 0x3, pkru = 1ull << 9, cr4_pke = 1ull << 22;
	/* The XSAVE header (XSTATE_BV first) follows the 512-byte legacy area. */
	if (len < 576)
		return errmsg(err, errlen, -EINVAL, "state file: vCPU %u XSAVE area is short",
			      vcpu);
	host_xfeatures |= fp_sse;
	char badbuf[512];
	struct line bad = {badbuf, sizeof(badbuf), 0, 0};
	badbuf[0] = 0;
	for (int bit = 0; bit < 64; bit++) {
		uint64_t m = 1ull << bit;
		if ((xcr0 & m) && !(host_xfeatures & m))
			line_add(&bad, "%sXCR0 bit %d %s (the guest enabled it; not offered here)",
				 bad.items++ ? "; " : "", bit,
				 bit < 32 && ld_0_eax[bit] ? ld_0_eax[bit] : "(unnamed)");
	}
	uint64_t bv = get_le64(xsave + 512);
	for (int bit = 0; bit < 64; bit++) {
		uint64_t m = 1ull << bit;
		if (!(bv & m) || (host_xfeatures & m))
			continue;
		const char *name = bit < 32 && ld_0_eax[bit] ? ld_0_eax[bit] : "(unnamed)";
		/*
		 * Without the XCR0 bit no instruction reaches the component (XRSTOR's mask is
		 * XCR0, the registers #UD); PKRU alone is reached through CR4.PKE instead.
		 */
		bool reachable = (xcr0 & m) || (m == pkru && (cr4 & cr4_pke));
		if (reachable) {
			if (!(xcr0 & m)) /* else already named as an XCR0 bit */
				line_add(&bad, "%sXSAVE component %d %s (in use; not offered here)",
					 bad.items++ ? "; " : "", bit, name);
			continue;
		}
		bv &= ~m;
		note_line(note, ctx, 1,
			  "vCPU %u: XSAVE component %d %s dropped (not offered here): the guest "
			  "never enabled it, nothing it can reach is lost",
			  vcpu, bit, name);
	}
	if (bad.items)
		return errmsg(err, errlen, -ENOEXEC,
			      "this host cannot take vCPU %u's CPU state: %s", vcpu, badbuf);
	put_le64(xsave + 512, bv);
	return 0;
}
