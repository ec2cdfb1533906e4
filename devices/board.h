/* The x86 board: which legacy devices a cove VM has and where they sit. */
#ifndef COVE_BOARD_H
#define COVE_BOARD_H

#include "cmos_rtc.h"
#include "i8042.h"
#include "serial.h"

struct vm;

struct board {
	struct serial com1;
	struct i8042 kbd;
	struct cmos_rtc rtc;
};

/* Creates and registers every board device; serial output goes to console_fd. */
int board_create(struct board *b, struct vm *vm, int console_fd);
void board_destroy(struct board *b);

#endif
