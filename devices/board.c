/* The x86 board: COM1, the i8042 and the CMOS clock on the port bus; the only file that names them. */
#include "board.h"

#include "vm.h"

int board_create(struct board *b, struct vm *vm, int console_fd)
{
	int r = serial_create(&b->com1, vm, console_fd);
	if (r) {
		log_err(vm->log, "cannot register serial port: %d", r);
		return r;
	}
	r = i8042_create(&b->kbd, vm);
	if (r) {
		log_err(vm->log, "cannot register i8042: %d", r);
		serial_destroy(&b->com1);
		return r;
	}
	r = cmos_rtc_create(&b->rtc, vm);
	if (r) {
		log_err(vm->log, "cannot register CMOS clock: %d", r);
		i8042_destroy(&b->kbd);
		serial_destroy(&b->com1);
		return r;
	}
	vm->reset_dev = &b->kbd;
	vm->send_ctrl_alt_del = i8042_send_ctrl_alt_del;
	return 0;
}

void board_destroy(struct board *b)
{
	cmos_rtc_destroy(&b->rtc);
	i8042_destroy(&b->kbd);
	serial_destroy(&b->com1);
}
