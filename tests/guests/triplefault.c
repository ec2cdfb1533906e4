/* Test guest: triple faults on purpose, to check cove's handling of KVM_EXIT_SHUTDOWN. */
#include "rt.h"

struct idt_ptr {
	uint16_t limit;
	uint64_t base;
} __attribute__((packed));

/* Limit 0: no gate is reachable, so #UD escalates to #DF and then to a triple fault. */
static const struct idt_ptr empty_idt = {0, 0};

int main(void)
{
	serial_puts("about to triple fault\n");
	asm volatile("lidt %0\n\tud2" : : "m"(empty_idt));
	for (;;)
		asm volatile("cli; hlt");
}
