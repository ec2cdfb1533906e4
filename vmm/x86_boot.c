/* x86 boot state: GDT, identity-mapped page tables, boot_params zero page and 64-bit entry registers. */
#include "x86_boot.h"

#include <asm/bootparam.h>
#include <errno.h>
#include <string.h>

#include "kvm_util.h"
#include "vm.h"

#define PTE_P 0x1ULL
#define PTE_RW 0x2ULL
#define PTE_PS 0x80ULL

#define CR0_PE 0x1ULL
#define CR0_MP 0x2ULL
#define CR0_ET 0x10ULL
#define CR0_NE 0x20ULL
#define CR0_PG 0x80000000ULL
#define CR4_PAE 0x20ULL
#define EFER_LME 0x100ULL
#define EFER_LMA 0x400ULL

#define E820_RAM 1
#define E820_RESERVED 2

/* A GDT entry from flags, base and limit (the classic packed layout). */
static uint64_t gdt_entry(uint16_t flags, uint32_t base, uint32_t limit)
{
	return ((uint64_t)(base & 0xff000000u) << 32) | ((uint64_t)(flags & 0xf0ffu) << 40) |
	       ((uint64_t)(limit & 0x000f0000u) << 32) | ((uint64_t)(base & 0x00ffffffu) << 16) |
	       (uint64_t)(limit & 0x0000ffffu);
}

int x86_boot_write_tables(struct guest_mem *mem)
{
	const uint64_t gdt[4] = {
		0,
		gdt_entry(0xa09b, 0, 0xfffff), /* 64-bit code */
		gdt_entry(0xc093, 0, 0xfffff), /* flat data */
		gdt_entry(0x808b, 0, 0xfffff), /* TSS */
	};
	uint64_t *g = guest_mem_ptr(mem, BOOT_GDT_ADDR, sizeof(gdt));
	uint64_t *idt = guest_mem_ptr(mem, BOOT_IDT_ADDR, 8);
	uint64_t *pml4 = guest_mem_ptr(mem, BOOT_PML4_ADDR, PAGE_SIZE);
	uint64_t *pdpt = guest_mem_ptr(mem, BOOT_PDPT_ADDR, PAGE_SIZE);
	uint64_t *pd = guest_mem_ptr(mem, BOOT_PD_ADDR, BOOT_PD_PAGES * PAGE_SIZE);
	if (!g || !idt || !pml4 || !pdpt || !pd)
		return -ENOSPC;
	memcpy(g, gdt, sizeof(gdt));
	*idt = 0;
	memset(pml4, 0, PAGE_SIZE);
	memset(pdpt, 0, PAGE_SIZE);
	pml4[0] = BOOT_PDPT_ADDR | PTE_P | PTE_RW;
	for (uint64_t i = 0; i < BOOT_PD_PAGES; i++)
		pdpt[i] = (BOOT_PD_ADDR + i * PAGE_SIZE) | PTE_P | PTE_RW;
	for (uint64_t i = 0; i < BOOT_PD_PAGES * 512; i++)
		pd[i] = (i << 21) | PTE_P | PTE_RW | PTE_PS;
	return 0;
}

static void e820_add(struct boot_params *bp, uint64_t addr, uint64_t size, uint32_t type)
{
	if (bp->e820_entries >= E820_MAX_ENTRIES_ZEROPAGE)
		return;
	struct boot_e820_entry *e = &bp->e820_table[bp->e820_entries++];
	e->addr = addr;
	e->size = size;
	e->type = type;
}

int x86_boot_write_zero_page(struct guest_mem *mem, const char *cmdline)
{
	size_t len = strlen(cmdline);
	if (len >= BOOT_CMDLINE_MAX)
		return -E2BIG;
	char *cl = guest_mem_ptr(mem, BOOT_CMDLINE_ADDR, BOOT_CMDLINE_MAX);
	struct boot_params *bp = guest_mem_ptr(mem, BOOT_ZERO_PAGE_ADDR, sizeof(*bp));
	if (!cl || !bp)
		return -ENOSPC;
	memset(cl, 0, BOOT_CMDLINE_MAX);
	memcpy(cl, cmdline, len);
	memset(bp, 0, sizeof(*bp));
	bp->hdr.boot_flag = 0xaa55;
	bp->hdr.header = 0x53726448; /* "HdrS" */
	bp->hdr.type_of_loader = 0xff;
	bp->hdr.cmd_line_ptr = (uint32_t)BOOT_CMDLINE_ADDR;
	bp->hdr.cmdline_size = (uint32_t)len;
	/* Low RAM ends at the EBDA as on a PC; RAM from 1 MiB up to the hole, then above 4 GiB. */
	e820_add(bp, 0, 0x9fc00, E820_RAM);
	for (uint32_t i = 0; i < mem->nr_slots; i++) {
		const struct mem_slot *s = &mem->slots[i];
		uint64_t start = s->gpa < HIMEM_START ? HIMEM_START : s->gpa;
		if (s->gpa + s->size > start)
			e820_add(bp, start, s->gpa + s->size - start, E820_RAM);
	}
	return 0;
}

static void seg_set(struct kvm_segment *s, uint16_t sel, uint8_t type, bool code64)
{
	memset(s, 0, sizeof(*s));
	s->selector = sel;
	s->base = 0;
	s->limit = 0xffffffff;
	s->type = type;
	s->present = 1;
	s->dpl = 0;
	s->s = 1;
	s->l = code64;
	s->db = !code64;
	s->g = 1;
}

int x86_boot_setup_vcpu(struct vcpu *v, uint64_t entry)
{
	struct logger *log = v->vm->log;
	struct kvm_sregs sregs;
	int r = KVM_IOCTL(log, v->fd, KVM_GET_SREGS, &sregs);
	if (r)
		return r;
	seg_set(&sregs.cs, BOOT_CS, 0xb, true);
	seg_set(&sregs.ds, BOOT_DS, 0x3, false);
	sregs.es = sregs.fs = sregs.gs = sregs.ss = sregs.ds;
	memset(&sregs.tr, 0, sizeof(sregs.tr));
	sregs.tr.selector = BOOT_TSS;
	sregs.tr.limit = 0xfffff;
	sregs.tr.type = 0xb;
	sregs.tr.present = 1;
	sregs.gdt.base = BOOT_GDT_ADDR;
	sregs.gdt.limit = 4 * 8 - 1;
	sregs.idt.base = BOOT_IDT_ADDR;
	sregs.idt.limit = 7;
	sregs.cr0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_PG;
	sregs.cr3 = BOOT_PML4_ADDR;
	sregs.cr4 = CR4_PAE;
	sregs.efer = EFER_LME | EFER_LMA;
	r = KVM_IOCTL(log, v->fd, KVM_SET_SREGS, &sregs);
	if (r)
		return r;

	struct kvm_regs regs;
	memset(&regs, 0, sizeof(regs));
	regs.rflags = 0x2;
	regs.rip = entry;
	regs.rsp = BOOT_STACK_TOP;
	regs.rbp = BOOT_STACK_TOP;
	regs.rsi = BOOT_ZERO_PAGE_ADDR;
	r = KVM_IOCTL(log, v->fd, KVM_SET_REGS, &regs);
	if (r)
		return r;

	struct kvm_fpu fpu;
	memset(&fpu, 0, sizeof(fpu));
	fpu.fcw = 0x37f;
	fpu.mxcsr = 0x1f80;
	return KVM_IOCTL(log, v->fd, KVM_SET_FPU, &fpu);
}
