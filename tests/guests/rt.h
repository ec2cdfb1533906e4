/* Tiny freestanding runtime shared by the cove test guests: port I/O, serial, i8042, cmdline. */
#ifndef COVE_TEST_GUEST_RT_H
#define COVE_TEST_GUEST_RT_H

#include <stdbool.h>
#include <stdint.h>

#define PAGE_SIZE 4096UL

#define UART_BASE 0x3f8
#define UART_DATA (UART_BASE + 0)
#define UART_LSR  (UART_BASE + 5)
#define UART_SCR  (UART_BASE + 7)
#define LSR_DR	  0x01
#define LSR_THRE  0x20

#define I8042_DATA	0x60
#define I8042_STATUS	0x64
#define I8042_CMD	0x64
#define I8042_STR_OBF	0x01
#define I8042_CMD_RESET 0xfe

/* Scancode set 1 make code of Del: the last byte of the host's Ctrl-Alt-Del sequence. */
#define SC1_DEL_MAKE 0x53

/* Zero-page offset of hdr.cmd_line_ptr in Linux's struct boot_params. */
#define BOOT_PARAMS_CMD_LINE_PTR 0x228
#define CMDLINE_MAX		 4096

/* Guest-physical address of the zero page as passed in RSI; 0 when booted through PVH. */
extern uint64_t rt_boot_params;

static inline void outb(uint16_t port, uint8_t val)
{
	asm volatile("outb %0, %1" : : "a"(val), "Nd"(port));
}

static inline uint8_t inb(uint16_t port)
{
	uint8_t val;

	asm volatile("inb %1, %0" : "=a"(val) : "Nd"(port));
	return val;
}

static inline void cpu_pause(void)
{
	asm volatile("pause" : : : "memory");
}

void serial_putc(char c);
void serial_puts(const char *s);
/* Lowercase hex, exactly @digits digits (the low ones), no 0x prefix. */
void put_hex(uint64_t val, int digits);
void put_dec(uint64_t val);
/* A received byte, or -1 when none is waiting. */
int serial_trygetc(void);
/* Blocks until a byte arrives. */
uint8_t serial_getc(void);
/* A byte from the i8042 output buffer, or -1 when it is empty. */
int i8042_trygetc(void);
/* Ask the VMM to stop: the i8042 pulse-reset command is cove's clean-exit signal. */
__attribute__((noreturn)) void i8042_reset(void);

/* The kernel command line; "" when there is none. */
const char *cmdline(void);
/* Value of the first "key=<dec|0xhex>" token; false (and @val untouched) if absent or malformed. */
bool cmdline_u64(const char *key, uint64_t *val);

int main(void);

#endif
