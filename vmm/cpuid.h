/* CPUID: what KVM supports, adjusted per vCPU (APIC ID, hypervisor bit). */
#ifndef COVE_CPUID_H
#define COVE_CPUID_H

#include <linux/kvm.h>

/* KVM_GET_SUPPORTED_CPUID plus what KVM emulates but omits there. Allocates *out (free()); 0 or -errno. */
int cpuid_get_supported(int kvm_fd, struct kvm_cpuid2 **out);
/* Copy of `base` with per-vCPU fields set; returns NULL on allocation failure. */
struct kvm_cpuid2 *cpuid_for_vcpu(const struct kvm_cpuid2 *base, int vcpu_id, int nr_vcpus);

#endif
