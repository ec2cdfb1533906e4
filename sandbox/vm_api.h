/* Binds the control API's backend hooks to a running struct vm. */
#ifndef COVE_VM_API_H
#define COVE_VM_API_H

#include "sandbox/api.h"
#include "vmm/vm.h"

void vm_api_backend(struct vm *vm, struct api_backend *be);

#endif
