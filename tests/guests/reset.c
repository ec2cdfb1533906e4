/* Test guest: requests an i8042 reset straight away, to check cove treats it as a clean stop. */
#include "rt.h"

int main(void)
{
	serial_puts("resetting\n");
	i8042_reset();
}
