/* Intel MultiProcessor table: how a guest without ACPI finds its CPUs, IOAPIC and IRQ routing. */
#ifndef COVE_MPTABLE_H
#define COVE_MPTABLE_H

#include <stdint.h>

#include "vmm/guest_mem.h"

#define MPTABLE_MAX_CPUS 254

/* Writes the floating pointer and config table at BOOT_MPTABLE_ADDR. 0, -EINVAL or -ENOSPC. */
int mptable_write(struct guest_mem *mem, int nr_cpus);

#endif
