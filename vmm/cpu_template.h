/*
 * CPU templates: a named, fleet-wide CPUID baseline applied to what KVM offers before any vCPU
 * is created, so a chain saved on one host restores on another host of the same vendor whose
 * CPU offers more, or fewer, features outside the baseline (CPU_TEMPLATES.md).
 */
#ifndef COVE_CPU_TEMPLATE_H
#define COVE_CPU_TEMPLATE_H

#include <stdbool.h>
#include <linux/kvm.h>

/* Longest template name, with its NUL. */
#define CPU_TEMPLATE_NAME_MAX 32

/* Whether NAME is a template cove ships (an empty name is no template, and not known). */
bool cpu_template_known(const char *name);

/* The shipped templates' names, comma-separated, for help and error lines. */
const char *cpu_template_names(void);

/*
 * Narrows `c` (KVM_GET_SUPPORTED_CPUID's answer) to template NAME in place: every feature
 * register the template covers keeps only the bits its allowlist names and this host offers;
 * leaves the template does not cover pass through. 0, or -ENOENT for an unknown name.
 */
int cpu_template_apply(const char *name, struct kvm_cpuid2 *c);

#endif
