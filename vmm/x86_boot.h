/* x86 boot state: guest-physical layout of boot structures, page tables, GDT, zero page, entry registers. */
#ifndef COVE_X86_BOOT_H
#define COVE_X86_BOOT_H

#include <stdbool.h>
#include <stdint.h>

#include "vmm/guest_mem.h"

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

#define BOOT_PVH_INFO_ADDR 0x6000ULL /* hvm_start_info, then its memory map and module list */
#define BOOT_MPTABLE_ADDR 0x9fc00ULL /* MP floating pointer + config table, in the EBDA */
#define BOOT_EBDA_END 0xa0000ULL

struct kernel_image;

/* Writes GDT (64-bit or, for PVH, 32-bit code segment), IDT and identity-map page tables. */
int x86_boot_write_tables(struct guest_mem *mem, bool pvh);
/*
 * Writes the command line and a boot_params zero page with the e820 map; for a
 * bzImage, its setup header is copied in first.  -E2BIG for a long cmdline.
 */
int x86_boot_write_zero_page(struct guest_mem *mem, const char *cmdline,
			     const struct kernel_image *img);
/* Sets the initrd location in the zero page (64-bit entry) or the PVH module list. */
int x86_boot_set_initrd(struct guest_mem *mem, uint64_t addr, uint64_t size);
/* Writes hvm_start_info for a PVH entry (command line, e820-style map, initrd module). */
int x86_boot_write_pvh_info(struct guest_mem *mem, const char *cmdline, uint64_t initrd_addr,
			    uint64_t initrd_size);

struct vcpu;
enum boot_mode { BOOT_LONG_MODE, BOOT_PVH };
/*
 * Entry state for the boot vCPU: long mode (rip=entry, rsi=zero page) or PVH
 * 32-bit protected mode, paging off (rip=entry, rbx=hvm_start_info).
 */
int x86_boot_setup_vcpu(struct vcpu *v, uint64_t entry, enum boot_mode mode);
/* State every vCPU needs before Linux runs on it: boot MSRs, LAPIC LINT0=ExtINT, LINT1=NMI. */
int x86_boot_setup_cpu_common(struct vcpu *v);

#endif
