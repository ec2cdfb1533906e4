/* x86 boot state: GDT, identity-mapped page tables, boot_params zero page and 64-bit entry registers. */
#include "vmm/x86_boot.h"

#include <asm/bootparam.h>
#include <errno.h>
#include <string.h>

#include "vmm/kvm_util.h"
#include "vmm/loader.h"
#include "vmm/vm.h"

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

int x86_boot_write_tables(struct guest_mem *mem, bool pvh)
{
	const uint64_t gdt[4] = {
		0,
		/* PVH starts in 32-bit protected mode; everything else in long mode. */
		pvh ? gdt_entry(0xc09b, 0, 0xfffff) : gdt_entry(0xa09b, 0, 0xfffff),
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

static void e820_fill(struct guest_mem *mem,
		      void (*add)(void *ctx, uint64_t addr, uint64_t size, uint32_t type), void *ctx)
{
	/* Low RAM stops at the EBDA (MP table); RAM from 1 MiB up to the hole, then above 4 GiB. */
	add(ctx, 0, BOOT_MPTABLE_ADDR, E820_RAM);
	add(ctx, BOOT_MPTABLE_ADDR, BOOT_EBDA_END - BOOT_MPTABLE_ADDR, E820_RESERVED);
	for (uint32_t i = 0; i < mem->nr_slots; i++) {
		const struct mem_slot *s = &mem->slots[i];
		uint64_t start = s->gpa < HIMEM_START ? HIMEM_START : s->gpa;
		if (s->gpa + s->size > start)
			add(ctx, start, s->gpa + s->size - start, E820_RAM);
	}
}

static void zp_add(void *ctx, uint64_t addr, uint64_t size, uint32_t type)
{
	e820_add(ctx, addr, size, type);
}

int x86_boot_write_zero_page(struct guest_mem *mem, const char *cmdline,
			     const struct kernel_image *img)
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
	if (img && img->kind == KERNEL_BZIMAGE) {
		/* The kernel reads its own header fields (version, init_size...) from here. */
		memcpy((uint8_t *)bp + SETUP_HDR_OFF, img->setup_hdr, img->setup_hdr_len);
	} else {
		bp->hdr.boot_flag = 0xaa55;
		bp->hdr.header = 0x53726448; /* "HdrS" */
		bp->hdr.kernel_alignment = 0x1000000;
	}
	bp->hdr.type_of_loader = 0xff;
	bp->hdr.loadflags |= 0x01; /* LOADED_HIGH: the kernel sits at 1 MiB */
	bp->hdr.cmd_line_ptr = (uint32_t)BOOT_CMDLINE_ADDR;
	bp->hdr.cmdline_size = (uint32_t)len;
	e820_fill(mem, zp_add, bp);
	return 0;
}

int x86_boot_set_initrd(struct guest_mem *mem, uint64_t addr, uint64_t size)
{
	struct boot_params *bp = guest_mem_ptr(mem, BOOT_ZERO_PAGE_ADDR, sizeof(*bp));
	if (!bp || addr > UINT32_MAX || size > UINT32_MAX)
		return -EINVAL;
	bp->hdr.ramdisk_image = (uint32_t)addr;
	bp->hdr.ramdisk_size = (uint32_t)size;
	return 0;
}

/* The PVH boot ABI's structures (Xen's public hvm/start_info.h). */
#define HVM_START_MAGIC 0x336ec578
struct hvm_start_info {
	uint32_t magic;
	uint32_t version;
	uint32_t flags;
	uint32_t nr_modules;
	uint64_t modlist_paddr;
	uint64_t cmdline_paddr;
	uint64_t rsdp_paddr;
	uint64_t memmap_paddr;
	uint32_t memmap_entries;
	uint32_t reserved;
};
struct hvm_modlist_entry {
	uint64_t paddr;
	uint64_t size;
	uint64_t cmdline_paddr;
	uint64_t reserved;
};
struct hvm_memmap_entry {
	uint64_t addr;
	uint64_t size;
	uint32_t type;
	uint32_t reserved;
};
#define PVH_MODLIST_ADDR (BOOT_PVH_INFO_ADDR + 0x40)
#define PVH_MEMMAP_ADDR (BOOT_PVH_INFO_ADDR + 0x80)
#define PVH_MEMMAP_MAX ((BOOT_ZERO_PAGE_ADDR - PVH_MEMMAP_ADDR) / sizeof(struct hvm_memmap_entry))

struct pvh_map {
	struct hvm_memmap_entry *e;
	uint32_t n;
};

static void pvh_add(void *ctx, uint64_t addr, uint64_t size, uint32_t type)
{
	struct pvh_map *m = ctx;
	if (m->n < PVH_MEMMAP_MAX)
		m->e[m->n++] = (struct hvm_memmap_entry){ .addr = addr, .size = size, .type = type };
}

int x86_boot_write_pvh_info(struct guest_mem *mem, const char *cmdline, uint64_t initrd_addr,
			    uint64_t initrd_size)
{
	struct hvm_start_info *si = guest_mem_ptr(mem, BOOT_PVH_INFO_ADDR, sizeof(*si));
	struct hvm_modlist_entry *mod = guest_mem_ptr(mem, PVH_MODLIST_ADDR, sizeof(*mod));
	struct pvh_map map = { .e = guest_mem_ptr(mem, PVH_MEMMAP_ADDR,
						  PVH_MEMMAP_MAX * sizeof(struct hvm_memmap_entry)) };
	char *cl = guest_mem_ptr(mem, BOOT_CMDLINE_ADDR, BOOT_CMDLINE_MAX);
	size_t len = strlen(cmdline);
	if (!si || !mod || !map.e || !cl)
		return -ENOSPC;
	if (len >= BOOT_CMDLINE_MAX)
		return -E2BIG;
	memset(cl, 0, BOOT_CMDLINE_MAX);
	memcpy(cl, cmdline, len);
	e820_fill(mem, pvh_add, &map);
	*si = (struct hvm_start_info){
		.magic = HVM_START_MAGIC,
		.version = 1,
		.cmdline_paddr = BOOT_CMDLINE_ADDR,
		.memmap_paddr = PVH_MEMMAP_ADDR,
		.memmap_entries = map.n,
	};
	if (initrd_size) {
		*mod = (struct hvm_modlist_entry){ .paddr = initrd_addr, .size = initrd_size };
		si->nr_modules = 1;
		si->modlist_paddr = PVH_MODLIST_ADDR;
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

int x86_boot_setup_vcpu(struct vcpu *v, uint64_t entry, enum boot_mode mode)
{
	struct logger *log = v->vm->log;
	struct kvm_sregs sregs;
	int r = KVM_IOCTL(log, v->fd, KVM_GET_SREGS, &sregs);
	if (r)
		return r;
	bool pvh = mode == BOOT_PVH;
	seg_set(&sregs.cs, BOOT_CS, 0xb, !pvh);
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
	if (pvh) {
		/* PVH: 32-bit protected mode, paging off; the kernel builds its own tables. */
		sregs.cr0 = CR0_PE | CR0_ET;
		sregs.cr3 = 0;
		sregs.cr4 = 0;
		sregs.efer = 0;
	} else {
		sregs.cr0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_PG;
		sregs.cr3 = BOOT_PML4_ADDR;
		sregs.cr4 = CR4_PAE;
		sregs.efer = EFER_LME | EFER_LMA;
	}
	r = KVM_IOCTL(log, v->fd, KVM_SET_SREGS, &sregs);
	if (r)
		return r;

	struct kvm_regs regs = {
	    .rflags = 0x2, .rip = entry, .rsp = BOOT_STACK_TOP, .rbp = BOOT_STACK_TOP};
	if (pvh)
		regs.rbx = BOOT_PVH_INFO_ADDR;
	else
		regs.rsi = BOOT_ZERO_PAGE_ADDR;
	r = KVM_IOCTL(log, v->fd, KVM_SET_REGS, &regs);
	if (r)
		return r;

	struct kvm_fpu fpu = {.fcw = 0x37f, .mxcsr = 0x1f80};
	return KVM_IOCTL(log, v->fd, KVM_SET_FPU, &fpu);
}

#define MSR_IA32_SYSENTER_CS 0x174
#define MSR_IA32_SYSENTER_ESP 0x175
#define MSR_IA32_SYSENTER_EIP 0x176
#define MSR_IA32_MISC_ENABLE 0x1a0
#define MSR_MTRR_DEF_TYPE 0x2ff
#define MSR_STAR 0xc0000081
#define MSR_LSTAR 0xc0000082
#define MSR_CSTAR 0xc0000083
#define MSR_SYSCALL_MASK 0xc0000084
#define MSR_KERNEL_GS_BASE 0xc0000102

#define APIC_LVT_LINT0 0x350
#define APIC_LVT_LINT1 0x360
#define APIC_MODE_NMI 0x4
#define APIC_MODE_EXTINT 0x7

static void lvt_set_mode(struct kvm_lapic_state *l, unsigned reg, uint32_t mode)
{
	uint32_t v;
	memcpy(&v, l->regs + reg, sizeof(v));
	v = (v & ~0x700u) | (mode << 8);
	memcpy(l->regs + reg, &v, sizeof(v));
}

int x86_boot_setup_cpu_common(struct vcpu *v)
{
	struct logger *log = v->vm->log;
	static const struct {
		uint32_t index;
		uint64_t value;
	} boot_msrs[] = {
		{ MSR_IA32_SYSENTER_CS, 0 },
		{ MSR_IA32_SYSENTER_ESP, 0 },
		{ MSR_IA32_SYSENTER_EIP, 0 },
		{ MSR_STAR, 0 },
		{ MSR_LSTAR, 0 },
		{ MSR_CSTAR, 0 },
		{ MSR_SYSCALL_MASK, 0 },
		{ MSR_KERNEL_GS_BASE, 0 },
		{ MSR_IA32_MISC_ENABLE, 1 },			/* fast strings */
		{ MSR_MTRR_DEF_TYPE, (1u << 11) | 6 },	/* MTRRs on, default write-back */
	};
	enum { NR = sizeof(boot_msrs) / sizeof(boot_msrs[0]) };
	struct {
		struct kvm_msrs hdr;
		struct kvm_msr_entry e[NR];
	} msrs;
	memset(&msrs, 0, sizeof(msrs));
	msrs.hdr.nmsrs = NR;
	for (int i = 0; i < NR; i++) {
		msrs.e[i].index = boot_msrs[i].index;
		msrs.e[i].data = boot_msrs[i].value;
	}
	int r = kvm_ioctl_raw(v->fd, KVM_SET_MSRS, &msrs);
	if (r != NR) {
		/* KVM_SET_MSRS returns how many it set; a short count names the first refused MSR. */
		log_err(log, "KVM_SET_MSRS: MSR 0x%x refused", r >= 0 && r < NR ? msrs.e[r].index : 0);
		return r < 0 ? r : -EINVAL;
	}
	/* LINT0 carries the PIC's interrupts (ExtINT), LINT1 the NMI, as a PC's firmware sets. */
	struct kvm_lapic_state lapic;
	r = KVM_IOCTL(log, v->fd, KVM_GET_LAPIC, &lapic);
	if (r)
		return r;
	lvt_set_mode(&lapic, APIC_LVT_LINT0, APIC_MODE_EXTINT);
	lvt_set_mode(&lapic, APIC_LVT_LINT1, APIC_MODE_NMI);
	return KVM_IOCTL(log, v->fd, KVM_SET_LAPIC, &lapic);
}
