/* Test guest: touches assigned and unassigned PIO/MMIO and prints what came back, for bus tests. */
#include "rt.h"

#define PIO_UNASSIGNED	  0x510
#define MMIO_UNASSIGNED	  0xd0000000UL
#define MMIO64_UNASSIGNED 0xd0001000UL

static void report(const char *what, uint64_t val, int digits)
{
	serial_puts(what);
	serial_putc(' ');
	put_hex(val, digits);
	serial_putc('\n');
}

int main(void)
{
	/* volatile so each access is exactly one load/store of the stated width. */
	volatile uint32_t *mmio32 = (volatile uint32_t *)MMIO_UNASSIGNED;
	volatile uint64_t *mmio64 = (volatile uint64_t *)MMIO64_UNASSIGNED;

	outb(UART_SCR, 0x5a);
	report("pio scratch", inb(UART_SCR), 2);
	report("pio unassigned", inb(PIO_UNASSIGNED), 2);
	report("mmio unassigned", *mmio32, 8);
	*mmio32 = 0x12345678;
	report("mmio after write", *mmio32, 8);
	report("mmio64 unassigned", *mmio64, 16);
	serial_puts("probe done\n");
	i8042_reset();
}
