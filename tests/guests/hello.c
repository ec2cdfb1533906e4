/* Test guest: prints one greeting line on the serial port, then asks the VMM to stop. */
#include "rt.h"

int main(void)
{
	serial_puts("Hello from a cove test guest\n");
	i8042_reset();
}
