/* Saves and restores what KVM holds for a VM: every vCPU's registers and the irqchip, PIT and clock. */
#ifndef COVE_KVM_STATE_H
#define COVE_KVM_STATE_H

#include <stddef.h>

#include "snapshot/state_file.h"

struct vm;

/* Appends the VM's and every vCPU's KVM state to `b`. The VM must be paused. 0 or -errno. */
int kvm_state_save(struct vm *vm, struct state_buf *b);
/*
 * Loads the sections back into a freshly created VM whose vCPUs exist but have not run.
 * Every section is length-checked first; -EINVAL with a one-line reason in `err`.
 */
int kvm_state_restore(struct vm *vm, const struct state_section_ref *s, size_t n, char *err,
		      size_t errlen);

#endif
