/* CPUID: start from KVM_GET_SUPPORTED_CPUID and patch the fields that differ per vCPU. */
#include "vmm/cpuid.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#include <asm/kvm_para.h>

#define CPUID_MAX_ENTRIES 256

int cpuid_get_supported(int kvm_fd, struct kvm_cpuid2 **out)
{
	size_t sz = sizeof(struct kvm_cpuid2) + CPUID_MAX_ENTRIES * sizeof(struct kvm_cpuid_entry2);
	struct kvm_cpuid2 *c = calloc(1, sz);
	if (!c)
		return -ENOMEM;
	c->nent = CPUID_MAX_ENTRIES;
	if (ioctl(kvm_fd, KVM_GET_SUPPORTED_CPUID, c) < 0) {
		int r = -errno;
		free(c);
		return r;
	}
	/*
	 * KVM emulates the TSC-deadline timer in its LAPIC but leaves the bit out
	 * of the supported set.  Without it Linux calibrates the LAPIC timer
	 * against the PIT, which fails on slow or nested hosts and leaves the
	 * guest with no working timer.
	 */
	if (ioctl(kvm_fd, KVM_CHECK_EXTENSION, KVM_CAP_TSC_DEADLINE_TIMER) > 0) {
		for (uint32_t i = 0; i < c->nent; i++)
			if (c->entries[i].function == 1)
				c->entries[i].ecx |= 1u << 24;
	}
	*out = c;
	return 0;
}

struct kvm_cpuid2 *cpuid_for_vcpu(const struct kvm_cpuid2 *base, int vcpu_id, int nr_vcpus)
{
	size_t sz = sizeof(*base) + base->nent * sizeof(base->entries[0]);
	struct kvm_cpuid2 *c = malloc(sz);
	if (!c)
		return NULL;
	memcpy(c, base, sz);
	for (uint32_t i = 0; i < c->nent; i++) {
		struct kvm_cpuid_entry2 *e = &c->entries[i];
		switch (e->function) {
		case 1:
			/* Initial APIC ID and logical processor count live in EBX. */
			e->ebx = (e->ebx & 0x0000ffffu) | ((uint32_t)vcpu_id << 24) |
				 ((uint32_t)(nr_vcpus & 0xff) << 16);
			e->ecx |= 1u << 31; /* running under a hypervisor */
			if (nr_vcpus > 1)
				e->edx |= 1u << 28; /* HTT: the count in EBX[23:16] is valid */
			break;
		case KVM_CPUID_FEATURES:
			/*
			 * No asynchronous page faults. With them a guest task that touches a
			 * page the host has not got yet sleeps on a token whose completion lives
			 * only in this host kernel, which no snapshot holds, and lazy restore
			 * (userfaultfd) makes such faults common. Firecracker users saw guest
			 * processes stuck that way after snapshot loads, and Firecracker turned
			 * async PF off on AMD. The vCPU simply waits in KVM for the page.
			 */
			e->eax &= ~((1u << KVM_FEATURE_ASYNC_PF) | (1u << KVM_FEATURE_ASYNC_PF_VMEXIT) |
				    (1u << KVM_FEATURE_ASYNC_PF_INT));
			break;
		case 0xb:
		case 0x1f:
			e->edx = (uint32_t)vcpu_id; /* x2APIC ID */
			break;
		default:
			break;
		}
	}
	return c;
}
