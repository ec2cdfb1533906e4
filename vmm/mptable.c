/* Intel MP spec 1.4 table: CPUs, one ISA bus, the IOAPIC and its ISA IRQ routing, LINT0/LINT1. */
#include "vmm/mptable.h"

#include <errno.h>
#include <string.h>

#include "vmm/x86_boot.h"

#define APIC_DEFAULT_BASE 0xfee00000u
#define IOAPIC_DEFAULT_BASE 0xfec00000u
#define APIC_VERSION 0x14
#define IOAPIC_VERSION 0x11
#define MP_IRQ_LINES 16

enum { MP_PROCESSOR = 0, MP_BUS = 1, MP_IOAPIC = 2, MP_INTSRC = 3, MP_LINTSRC = 4 };
enum { MP_INT = 0, MP_NMI = 1, MP_EXTINT = 3 };

struct mpf_intel {
	char signature[4];
	uint32_t physptr;
	uint8_t length;
	uint8_t specification;
	uint8_t checksum;
	uint8_t feature[5];
} __attribute__((packed));

struct mpc_table {
	char signature[4];
	uint16_t length;
	uint8_t spec;
	uint8_t checksum;
	char oem[8];
	char productid[12];
	uint32_t oemptr;
	uint16_t oemsize;
	uint16_t oemcount;
	uint32_t lapic;
	uint32_t reserved;
} __attribute__((packed));

struct mpc_cpu {
	uint8_t type;
	uint8_t apicid;
	uint8_t apicver;
	uint8_t cpuflag;
	uint32_t cpufeature;
	uint32_t featureflag;
	uint32_t reserved[2];
} __attribute__((packed));

struct mpc_bus {
	uint8_t type;
	uint8_t busid;
	char bustype[6];
} __attribute__((packed));

struct mpc_ioapic {
	uint8_t type;
	uint8_t apicid;
	uint8_t apicver;
	uint8_t flags;
	uint32_t apicaddr;
} __attribute__((packed));

struct mpc_intsrc {
	uint8_t type;
	uint8_t irqtype;
	uint16_t irqflag;
	uint8_t srcbus;
	uint8_t srcbusirq;
	uint8_t dstapic;
	uint8_t dstirq;
} __attribute__((packed));

static uint8_t checksum(const void *p, size_t len)
{
	const uint8_t *b = p;
	uint8_t sum = 0;
	for (size_t i = 0; i < len; i++)
		sum += b[i];
	return (uint8_t)(0 - sum);
}

int mptable_write(struct guest_mem *mem, int nr_cpus)
{
	if (nr_cpus < 1 || nr_cpus > MPTABLE_MAX_CPUS)
		return -EINVAL;
	size_t size = sizeof(struct mpf_intel) + sizeof(struct mpc_table) +
		      (size_t)nr_cpus * sizeof(struct mpc_cpu) + sizeof(struct mpc_bus) +
		      sizeof(struct mpc_ioapic) + (MP_IRQ_LINES + 2) * sizeof(struct mpc_intsrc);
	if (size > BOOT_EBDA_END - BOOT_MPTABLE_ADDR)
		return -ENOSPC;
	uint8_t *base = guest_mem_ptr(mem, BOOT_MPTABLE_ADDR, size);
	if (!base)
		return -ENOSPC;
	memset(base, 0, size);

	struct mpf_intel *mpf = (struct mpf_intel *)base;
	struct mpc_table *tbl = (struct mpc_table *)(mpf + 1);
	uint8_t *p = (uint8_t *)(tbl + 1);
	uint8_t ioapic_id = (uint8_t)nr_cpus; /* APIC IDs 0..n-1 are the CPUs */

	for (int i = 0; i < nr_cpus; i++) {
		struct mpc_cpu c = {
			.type = MP_PROCESSOR,
			.apicid = (uint8_t)i,
			.apicver = APIC_VERSION,
			.cpuflag = (uint8_t)(1 | (i == 0 ? 2 : 0)), /* enabled, BSP */
			.cpufeature = 0x600,			       /* family 6 */
			.featureflag = (1u << 9) | (1u << 0),	       /* APIC, FPU */
		};
		memcpy(p, &c, sizeof(c));
		p += sizeof(c);
	}
	struct mpc_bus bus = { .type = MP_BUS, .busid = 0 };
	memcpy(bus.bustype, "ISA   ", 6);
	memcpy(p, &bus, sizeof(bus));
	p += sizeof(bus);
	struct mpc_ioapic io = { .type = MP_IOAPIC,
				 .apicid = ioapic_id,
				 .apicver = IOAPIC_VERSION,
				 .flags = 1,
				 .apicaddr = IOAPIC_DEFAULT_BASE };
	memcpy(p, &io, sizeof(io));
	p += sizeof(io);
	for (int irq = 0; irq < MP_IRQ_LINES; irq++) {
		/* KVM's default routing sends GSI 0 (the PIT) to IOAPIC pin 2, as on a PC. */
		struct mpc_intsrc src = { .type = MP_INTSRC,
					  .irqtype = MP_INT,
					  .srcbus = 0,
					  .srcbusirq = (uint8_t)irq,
					  .dstapic = ioapic_id,
					  .dstirq = (uint8_t)(irq == 0 ? 2 : irq) };
		memcpy(p, &src, sizeof(src));
		p += sizeof(src);
	}
	struct mpc_intsrc lint0 = { .type = MP_LINTSRC, .irqtype = MP_EXTINT, .dstapic = 0xff,
				    .dstirq = 0 };
	struct mpc_intsrc lint1 = { .type = MP_LINTSRC, .irqtype = MP_NMI, .dstapic = 0xff,
				    .dstirq = 1 };
	memcpy(p, &lint0, sizeof(lint0));
	p += sizeof(lint0);
	memcpy(p, &lint1, sizeof(lint1));
	p += sizeof(lint1);

	memcpy(tbl->signature, "PCMP", 4);
	tbl->length = (uint16_t)(p - (uint8_t *)tbl);
	tbl->spec = 4;
	memcpy(tbl->oem, "COVE    ", 8);
	memcpy(tbl->productid, "MICROVM     ", 12);
	tbl->oemcount = (uint16_t)(nr_cpus + 1 + 1 + MP_IRQ_LINES + 2);
	tbl->lapic = APIC_DEFAULT_BASE;
	tbl->checksum = checksum(tbl, tbl->length);

	memcpy(mpf->signature, "_MP_", 4);
	mpf->physptr = (uint32_t)(BOOT_MPTABLE_ADDR + sizeof(*mpf));
	mpf->length = 1;
	mpf->specification = 4;
	mpf->checksum = checksum(mpf, sizeof(*mpf));
	return 0;
}
