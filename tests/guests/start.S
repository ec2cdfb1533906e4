/* Entry points shared by the cove test guests: 64-bit _start for cove, a PVH stub for QEMU. */

#define EFER_MSR	0xc0000080
#define EFER_LME	0x100
#define CR0_PE		0x00000001
#define CR0_PG		0x80000000
#define CR4_PAE		0x20

/* Same page-table addresses cove documents, so both boot paths leave identical memory. */
#define PML4_ADDR	0x9000
#define PDPT_ADDR	0xa000
#define PD_ADDR		0xb000	/* four PDs, 0xb000..0xe000: 4 GiB of 2 MiB pages */
#define PTE_P_RW	0x003
#define PTE_P_RW_PS	0x083

#define GDT_CODE64	0x08
#define GDT_DATA	0x10

	.section .text, "ax", @progbits

/*
 * cove enters here in long mode with RSI = zero page. The VMM's RSP points
 * into its own low-memory area; switch before the first push so every guest
 * write lands in the two pages the dirty-log test expects.
 */
	.code64
	.globl _start
	.type _start, @function
_start:
	movq	$__stack_top, %rsp
	movq	%rsi, rt_boot_params(%rip)
	xorl	%ebp, %ebp
	call	main
1:	cli
	hlt
	jmp	1b
	.size _start, . - _start

/*
 * QEMU's PVH boot enters here in 32-bit protected mode, paging off, flat
 * segments, EBX = hvm_start_info (ignored: no command line under PVH).
 * No stack is promised, so none is used until _start sets one.
 */
	.code32
	.globl pvh_start32
	.type pvh_start32, @function
pvh_start32:
	cli
	cld

	/* Only the PML4 and PDPT need clearing: every PD entry is written below. */
	movl	$PML4_ADDR, %edi
	xorl	%eax, %eax
	movl	$(2 * 4096 / 4), %ecx
	rep stosl

	movl	$(PDPT_ADDR | PTE_P_RW), PML4_ADDR
	movl	$((PD_ADDR + 0x0000) | PTE_P_RW), PDPT_ADDR + 0
	movl	$((PD_ADDR + 0x1000) | PTE_P_RW), PDPT_ADDR + 8
	movl	$((PD_ADDR + 0x2000) | PTE_P_RW), PDPT_ADDR + 16
	movl	$((PD_ADDR + 0x3000) | PTE_P_RW), PDPT_ADDR + 24

	/* 2048 entries; the highest base (0xffe00000) still fits in the low dword. */
	movl	$PD_ADDR, %edi
	movl	$PTE_P_RW_PS, %eax
	movl	$2048, %ecx
2:	movl	%eax, (%edi)
	movl	$0, 4(%edi)
	addl	$0x200000, %eax
	addl	$8, %edi
	decl	%ecx
	jnz	2b

	lgdt	pvh_gdt_desc

	movl	%cr4, %eax
	orl	$CR4_PAE, %eax
	movl	%eax, %cr4

	movl	$PML4_ADDR, %eax
	movl	%eax, %cr3

	movl	$EFER_MSR, %ecx
	rdmsr
	orl	$EFER_LME, %eax
	wrmsr

	movl	%cr0, %eax
	orl	$(CR0_PE | CR0_PG), %eax
	movl	%eax, %cr0

	ljmp	$GDT_CODE64, $pvh_start64
	.size pvh_start32, . - pvh_start32

	.code64
pvh_start64:
	movl	$GDT_DATA, %eax
	movl	%eax, %ds
	movl	%eax, %es
	movl	%eax, %ss
	movl	%eax, %fs
	movl	%eax, %gs
	/* No zero page: the runtime reads RSI == 0 as an empty command line. */
	xorl	%esi, %esi
	jmp	_start

	.section .rodata, "a", @progbits
	.balign 16
pvh_gdt:
	.quad	0			/* null */
	.quad	0x00af9a000000ffff	/* 0x08: 64-bit code, DPL 0 */
	.quad	0x00cf92000000ffff	/* 0x10: flat data */
pvh_gdt_end:

	.balign 2
pvh_gdt_desc:
	.word	pvh_gdt_end - pvh_gdt - 1
	.long	pvh_gdt

/*
 * XEN_ELFNOTE_PHYS32_ENTRY (18). The address fits in 32 bits, but the
 * descriptor is 8 bytes like Linux's: QEMU 7.2 reads a size_t from a 64-bit
 * ELF's note, so a 4-byte descriptor would pick up whatever follows it.
 */
/*
 * Only the "-pvh" build of each guest carries the note: cove enters an ELF with
 * this note through PVH (32-bit protected mode), which this project's nested
 * PVM /dev/kvm cannot run, so the plain build keeps the 64-bit entry.
 */
#ifdef GUEST_PVH_NOTE
	.section .note.Xen, "a", @note
	.balign 4
	.long	4		/* namesz */
	.long	8		/* descsz */
	.long	18		/* type: XEN_ELFNOTE_PHYS32_ENTRY */
	.asciz	"Xen"
	.balign 4
	.quad	pvh_start32
	.balign 4
#endif

	.section .note.GNU-stack, "", @progbits
