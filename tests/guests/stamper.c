/* Test guest: stamps a chosen set of pages, in rounds, for dirty-log and snapshot tests. */
#include "rt.h"

/* Returns once the host sends 'q' on serial or Ctrl-Alt-Del reaches the i8042. */
static void wait_for_quit(void)
{
	for (;;) {
		if (serial_trygetc() == 'q')
			return;
		if (i8042_trygetc() == SC1_DEL_MAKE)
			return;
		cpu_pause();
	}
}

int main(void)
{
	uint64_t base = 0x1000000, count = 256, stride = 1, rounds = 1;
	uint64_t r, i;

	cmdline_u64("stamp_base", &base);
	cmdline_u64("stamp_count", &count);
	cmdline_u64("stamp_stride", &stride);
	cmdline_u64("rounds", &rounds);

	for (r = 1; r <= rounds; r++) {
		/* Each round stamps the next disjoint run, so the host can tell rounds apart. */
		uint64_t first = (r - 1) * count;

		for (i = 0; i < count; i++) {
			uint64_t addr = base + (first + i) * stride * PAGE_SIZE;

			*(volatile uint64_t *)(uintptr_t)addr = r << 32 | i;
		}
		serial_puts("stamped round ");
		put_dec(r);
		serial_puts(" pages ");
		put_dec(count);
		serial_putc('\n');
		/* The host snapshots or reads the dirty log here, then lets us go on. */
		if (r < rounds)
			serial_getc();
	}
	serial_puts("stamper done\n");
	wait_for_quit();
	serial_puts("bye\n");
	i8042_reset();
}
