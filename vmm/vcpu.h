/* vCPU threads: the KVM_RUN loop, exit dispatch to the buses, and the pause gate. */
#ifndef COVE_VCPU_H
#define COVE_VCPU_H

#include "vmm/vm.h"

int vcpu_create(struct vm *vm, struct vcpu *v, int id);
void vcpu_destroy(struct vcpu *v);
int vcpu_start(struct vcpu *v);
/* Human name of a KVM exit reason ("KVM_EXIT_SHUTDOWN"), for messages. */
const char *vcpu_exit_name(uint32_t reason);

#endif
