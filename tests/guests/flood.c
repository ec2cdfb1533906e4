/*
 * Test guest: floods the first virtio-blk queue forever from ring 3, keeping the avail ring a
 * full ring ahead of the used ring, so a device that serves "until the ring is empty" never
 * returns. flood.read=1 floods 64 MiB reads (slow on an overlay) instead of GET_ID requests.
 */
#include "rt.h"

#define MMIO		 0xd0000000UL
#define REG_MAGIC	 0x000
#define REG_DEVICE_ID	 0x008
#define REG_DRV_FEAT	 0x020
#define REG_DRV_FEAT_SEL 0x024
#define REG_QUEUE_SEL	 0x030
#define REG_QUEUE_NUM	 0x038
#define REG_QUEUE_READY	 0x044
#define REG_QUEUE_NOTIFY 0x050
#define REG_STATUS	 0x070
#define REG_DESC_LO	 0x080
#define REG_DESC_HI	 0x084
#define REG_AVAIL_LO	 0x090
#define REG_AVAIL_HI	 0x094
#define REG_USED_LO	 0x0a0
#define REG_USED_HI	 0x0a4

/* Guest-physical (= virtual: identity mapped) addresses; the image ends below 0x112000. */
#define PML4	     0x200000UL
#define PDPT	     0x201000UL
#define PD	     0x202000UL /* four of them: 4 GiB of 2 MiB pages */
#define GDT	     0x206000UL
#define USTACK_TOP   0x210000UL
#define DESC	     0x300000UL
#define AVAIL	     0x301000UL
#define USED	     0x302000UL
#define HDRS	     0x303000UL
#define BUFS	     0x304000UL
#define READ_BUF     0x4000000UL
#define READ_LEN     (64UL << 20)
#define QSIZE	     256
#define DESC_F_NEXT  1
#define DESC_F_WRITE 2

#define PTE_P  0x1UL
#define PTE_RW 0x2UL
#define PTE_US 0x4UL
#define PTE_PS 0x80UL

static void mmio_w(uint32_t off, uint32_t v)
{
	*(volatile uint32_t *)(MMIO + off) = v;
}

static uint32_t mmio_r(uint32_t off)
{
	return *(volatile uint32_t *)(MMIO + off);
}

static void put_desc(int i, uint64_t addr, uint32_t len, uint16_t flags, uint16_t next)
{
	volatile uint8_t *d = (volatile uint8_t *)(DESC + 16UL * i);
	*(volatile uint64_t *)d = addr;
	*(volatile uint32_t *)(d + 8) = len;
	*(volatile uint16_t *)(d + 12) = flags;
	*(volatile uint16_t *)(d + 14) = next;
}

/* GET_ID chains: header + 21 writable bytes (id, status); reads: header + 64 MiB + status. */
static int build_chains(bool read)
{
	int per = read ? 3 : 2, n = QSIZE / per;
	for (int c = 0; c < n; c++) {
		volatile uint32_t *h = (volatile uint32_t *)(HDRS + 16UL * c);
		h[0] = read ? 0 : 8; /* VIRTIO_BLK_T_IN or T_GET_ID */
		h[1] = 0;
		h[2] = 0; /* sector 0 */
		h[3] = 0;
		int d = c * per;
		put_desc(d, HDRS + 16UL * c, 16, DESC_F_NEXT, (uint16_t)(d + 1));
		if (read) {
			put_desc(d + 1, READ_BUF, READ_LEN, DESC_F_WRITE | DESC_F_NEXT,
				 (uint16_t)(d + 2));
			put_desc(d + 2, BUFS + 32UL * c, 1, DESC_F_WRITE, 0);
		} else {
			put_desc(d + 1, BUFS + 32UL * c, 21, DESC_F_WRITE, 0);
		}
	}
	volatile uint16_t *ring = (volatile uint16_t *)(AVAIL + 4);
	for (int i = 0; i < QSIZE; i++)
		ring[i] = (uint16_t)((i % n) * per);
	return n;
}

static bool setup_queue(bool read)
{
	if (mmio_r(REG_MAGIC) != 0x74726976 || mmio_r(REG_DEVICE_ID) != 2)
		return false;
	mmio_w(REG_STATUS, 0);
	mmio_w(REG_STATUS, 1 | 2); /* ACKNOWLEDGE | DRIVER */
	mmio_w(REG_DRV_FEAT_SEL, 1);
	mmio_w(REG_DRV_FEAT, 1); /* VERSION_1 only: no EVENT_IDX, no indirect */
	mmio_w(REG_DRV_FEAT_SEL, 0);
	mmio_w(REG_DRV_FEAT, 0);
	mmio_w(REG_STATUS, 1 | 2 | 8);
	build_chains(read);
	mmio_w(REG_QUEUE_SEL, 0);
	mmio_w(REG_QUEUE_NUM, QSIZE);
	mmio_w(REG_DESC_LO, (uint32_t)DESC);
	mmio_w(REG_DESC_HI, 0);
	mmio_w(REG_AVAIL_LO, (uint32_t)AVAIL);
	mmio_w(REG_AVAIL_HI, 0);
	mmio_w(REG_USED_LO, (uint32_t)USED);
	mmio_w(REG_USED_HI, 0);
	mmio_w(REG_QUEUE_READY, 1);
	mmio_w(REG_STATUS, 1 | 2 | 8 | 4); /* DRIVER_OK */
	return (mmio_r(REG_STATUS) & 0x4f) == (1 | 2 | 8 | 4);
}

/* User-accessible identity map and a GDT with ring-3 segments (0x1b data, 0x23 code). */
static void setup_ring3(void)
{
	volatile uint64_t *pml4 = (volatile uint64_t *)PML4, *pdpt = (volatile uint64_t *)PDPT;
	volatile uint64_t *pd = (volatile uint64_t *)PD;
	for (int i = 0; i < 512; i++)
		pml4[i] = pdpt[i] = 0;
	for (uint64_t i = 0; i < 2048; i++)
		pd[i] = (i << 21) | PTE_P | PTE_RW | PTE_US | PTE_PS;
	for (uint64_t i = 0; i < 4; i++)
		pdpt[i] = (PD + i * 4096) | PTE_P | PTE_RW | PTE_US;
	pml4[0] = PDPT | PTE_P | PTE_RW | PTE_US;
	volatile uint64_t *gdt = (volatile uint64_t *)GDT;
	gdt[0] = 0;
	gdt[1] = 0x00af9a000000ffffUL; /* 0x08: kernel code, 64-bit */
	gdt[2] = 0x00cf92000000ffffUL; /* 0x10: kernel data */
	gdt[3] = 0x00cff2000000ffffUL; /* 0x18: user data, DPL 3 */
	gdt[4] = 0x00affa000000ffffUL; /* 0x20: user code, 64-bit, DPL 3 */
	struct __attribute__((packed)) {
		uint16_t limit;
		uint64_t base;
	} d = {5 * 8 - 1, GDT};
	asm volatile("lgdt %0" : : "m"(d) : "memory");
	asm volatile("mov %0, %%cr3" : : "r"(PML4) : "memory");
}

/* Runs at native speed in ring 3 (IOPL 3, so it may still print). */
static void __attribute__((noreturn)) flood(void)
{
	volatile uint16_t *avail_idx = (volatile uint16_t *)(AVAIL + 2);
	volatile uint16_t *used_idx = (volatile uint16_t *)(USED + 2);
	uint16_t last = *used_idx;
	uint64_t done = 0, next_report = 1;
	unsigned int until_kick = 1;
	for (;;) {
		uint16_t u = *used_idx;
		done += (uint16_t)(u - last);
		last = u;
		/* A whole ring ahead of what the device finished: never empty. */
		*avail_idx = (uint16_t)(u + QSIZE);
		if (--until_kick == 0) {
			/* In case the device stopped: a fixed device comes back by itself. */
			until_kick = 1u << 16;
			mmio_w(REG_QUEUE_NOTIFY, 0);
		}
		if (done >= next_report) {
			serial_puts("flood: ");
			put_dec(done);
			serial_puts(" requests\n");
			while (next_report <= done)
				next_report *= 10;
		}
	}
}

int main(void)
{
	uint64_t read = 0;
	cmdline_u64("flood.read", &read);
	if (!setup_queue(read != 0)) {
		serial_puts("flood: no virtio-blk at 0xd0000000\n");
		i8042_reset();
	}
	setup_ring3();
	serial_puts(read ? "flood: reads from ring 3\n" : "flood: GET_ID from ring 3\n");
	/* iretq to ring 3 with IF clear and IOPL 3. */
	asm volatile("pushq $0x1b\n\t"
		     "pushq %0\n\t"
		     "pushq $0x3002\n\t"
		     "pushq $0x23\n\t"
		     "pushq %1\n\t"
		     "iretq"
		     :
		     : "r"(USTACK_TOP), "r"((uint64_t)flood)
		     : "memory");
	return 0;
}
