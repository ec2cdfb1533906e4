/* x86 boot state: guest-physical layout of boot structures, page tables, GDT, zero page, entry registers. */
#ifndef COVE_X86_BOOT_H
#define COVE_X86_BOOT_H

#include <stdint.h>

#include "guest_mem.h"

/* Guest-physical layout below 1 MiB (the same places Firecracker uses). */
#define BOOT_GDT_ADDR 0x500ULL
#define BOOT_IDT_ADDR 0x520ULL
#define BOOT_ZERO_PAGE_ADDR 0x7000ULL
#define BOOT_STACK_TOP 0x8ff0ULL
#define BOOT_PML4_ADDR 0x9000ULL
#define BOOT_PDPT_ADDR 0xa000ULL
#define BOOT_PD_ADDR 0xb000ULL /* four pages: identity map of the first 4 GiB in 2 MiB pages */
#define BOOT_PD_PAGES 4
#define BOOT_CMDLINE_ADDR 0x20000ULL
#define BOOT_CMDLINE_MAX 4096
#define HIMEM_START 0x100000ULL /* kernels and test guests load at or above 1 MiB */

/* GDT selectors. */
#define BOOT_CS 0x08
#define BOOT_DS 0x10
#define BOOT_TSS 0x18

/* Writes GDT, IDT and identity-map page tables into guest memory. */
int x86_boot_write_tables(struct guest_mem *mem);
/* Writes the command line and a boot_params zero page with the e820 map. -E2BIG for a long cmdline. */
int x86_boot_write_zero_page(struct guest_mem *mem, const char *cmdline);
struct vcpu;
/* Long-mode entry state for a vCPU: sregs, regs (rip=entry, rsi=zero page), FPU. */
int x86_boot_setup_vcpu(struct vcpu *v, uint64_t entry);

#endif
