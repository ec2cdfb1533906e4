/* Test guest: counts forever and prints ticks, so pause/resume and snapshot tests see progress. */
#include "rt.h"

#define ITERS_PER_TICK 20000

int main(void)
{
	uint64_t max_ticks = 0, counter = 0;
	unsigned int until_tick = ITERS_PER_TICK;

	cmdline_u64("ticks", &max_ticks);

	for (;;) {
		counter++;
		/* A countdown, not counter % N: guest ring-0 code may be interpreted. */
		if (--until_tick == 0) {
			uint64_t ticks = counter / ITERS_PER_TICK;

			until_tick = ITERS_PER_TICK;
			serial_puts("tick ");
			put_dec(ticks);
			serial_putc('\n');
			if (ticks == max_ticks) {
				serial_puts("counter done\n");
				i8042_reset();
			}
		}
		if (i8042_trygetc() == SC1_DEL_MAKE) {
			serial_puts("ctrl-alt-del\n");
			i8042_reset();
		}
		if (serial_trygetc() == 'q') {
			serial_puts("quit\n");
			i8042_reset();
		}
	}
}
