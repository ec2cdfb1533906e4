/* The CPU-state rule: can this host take a chain's MSRs and CPUID? Pure, see CPU_COMPAT.md. */
#ifndef COVE_CPU_COMPAT_H
#define COVE_CPU_COMPAT_H

#include <stddef.h>
#include <stdint.h>
#include <linux/kvm.h>

/* What the table says about an MSR the chain has and this host's KVM cannot set. */
enum msr_policy {
	MSR_REFUSE,	   /* a running guest depends on its value */
	MSR_DROP,	   /* no guest can depend on it: dropped with a log line */
	MSR_DROP_IF_RESET, /* dropped only while it holds KVM's reset value (bits in `mask`) */
};

struct msr_rule {
	uint32_t first, last; /* the indices it covers; most rules name one MSR */
	const char *name;
	enum msr_policy policy;
	uint64_t reset, mask; /* MSR_DROP_IF_RESET: droppable when (value & mask) == reset */
	const char *why;
};

/* The table's rule for `index`, or NULL: an MSR the table does not know is refused. */
const struct msr_rule *cpu_msr_rule(uint32_t index);
/* The MSR's name for messages ("IA32_TSC"), or NULL. */
const char *cpu_msr_name(uint32_t index);
/*
 * Whether the MSR (with the value the chain holds) may be left out of the restore: the table
 * says drop, or drop-if-reset and the value is the reset value.
 */
int cpu_msr_droppable(uint32_t index, uint64_t value);

/* One log line (no newline) for the caller's logger; `warn`: something was dropped or skipped. */
typedef void (*cpu_compat_note_fn)(void *ctx, int warn, const char *line);

struct cpu_compat_in {
	uint32_t vcpu;
	/* The chain's saved MSRs of this vCPU, and the MSRs this host's KVM saves and restores. */
	const struct kvm_msr_entry *msrs;
	uint32_t nmsrs;
	const uint32_t *host_msrs;
	uint32_t nhost_msrs;
	/* The CPUID the guest saw (NULL: the chain recorded none, the check is skipped with a
	 * note) and what this host gives the same vCPU. */
	const struct kvm_cpuid_entry2 *cpuid;
	uint32_t ncpuid;
	const struct kvm_cpuid_entry2 *host_cpuid;
	uint32_t nhost_cpuid;
};

/*
 * Decides per the table. The MSRs to restore (those both sides have) go to keep[] (room for
 * in->nmsrs), their count to *nkeep; each dropped MSR, and the MSRs this host has that the
 * chain lacks, are noted. 0 when the host can take the state; otherwise -ENOEXEC (or -EINVAL for a
 * bad state file) with one line in err naming every refused MSR and CPUID feature.
 */
int cpu_compat_check(const struct cpu_compat_in *in, struct kvm_msr_entry *keep, uint32_t *nkeep,
		     cpu_compat_note_fn note, void *ctx, char *err, size_t errlen);

/*
 * The vCPU's XSAVE area (KVM_GET_XSAVE's standard format, `len` bytes) against this host's
 * XSAVE features (CPUID 0xD.0 EDX:EAX). A component the guest enabled in XCR0 (or PKRU while
 * CR4.PKE is on) that this host lacks is refused by number and name; one the guest never
 * enabled holds nothing it can reach, so its bit is cleared from XSTATE_BV with a note.
 * 0, -ENOEXEC (refused) or -EINVAL (a short area) with one line in err.
 */
int cpu_compat_xsave(uint32_t vcpu, uint8_t *xsave, size_t len, uint64_t xcr0, uint64_t cr4,
		     uint64_t host_xfeatures, cpu_compat_note_fn note, void *ctx, char *err,
		     size_t errlen);

#endif
