/* Tiny freestanding runtime shared by the cove test guests: port I/O, serial, i8042, cmdline. */
#include "rt.h"

/*
 * Written by _start before anything else, so the .data/.bss page is always
 * dirtied even by guests without globals of their own: the dirty-log test can
 * then expect a fixed set of guest pages.
 */
uint64_t rt_boot_params;

void serial_putc(char c)
{
	while (!(inb(UART_LSR) & LSR_THRE))
		cpu_pause();
	outb(UART_DATA, (uint8_t)c);
}

void serial_puts(const char *s)
{
	while (*s)
		serial_putc(*s++);
}

void put_hex(uint64_t val, int digits)
{
	static const char hex[] = "0123456789abcdef";

	while (digits-- > 0)
		serial_putc(hex[(val >> (digits * 4)) & 0xf]);
}

void put_dec(uint64_t val)
{
	char buf[20]; /* 2^64 - 1 has 20 digits */
	int n = 0;

	do {
		buf[n++] = (char)('0' + val % 10);
		val /= 10;
	} while (val);
	while (n)
		serial_putc(buf[--n]);
}

int serial_trygetc(void)
{
	if (!(inb(UART_LSR) & LSR_DR))
		return -1;
	return inb(UART_DATA);
}

uint8_t serial_getc(void)
{
	int c;

	while ((c = serial_trygetc()) < 0)
		cpu_pause();
	return (uint8_t)c;
}

int i8042_trygetc(void)
{
	if (!(inb(I8042_STATUS) & I8042_STR_OBF))
		return -1;
	return inb(I8042_DATA);
}

void i8042_reset(void)
{
	outb(I8042_CMD, I8042_CMD_RESET);
	/* Only reached if the VMM ignores the reset (e.g. QEMU microvm has no i8042). */
	for (;;)
		asm volatile("cli; hlt");
}

const char *cmdline(void)
{
	uint32_t ptr;

	if (!rt_boot_params)
		return "";
	ptr = *(const volatile uint32_t *)(uintptr_t)(rt_boot_params + BOOT_PARAMS_CMD_LINE_PTR);
	if (!ptr)
		return "";
	return (const char *)(uintptr_t)ptr;
}

static bool is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n';
}

static int digit_value(char c, unsigned int base)
{
	int v;

	if (c >= '0' && c <= '9')
		v = c - '0';
	else if (c >= 'a' && c <= 'f')
		v = c - 'a' + 10;
	else if (c >= 'A' && c <= 'F')
		v = c - 'A' + 10;
	else
		return -1;
	return v < (int)base ? v : -1;
}

/* Parses the number that ends at the next space or NUL; rejects trailing junk. */
static bool parse_u64(const char *s, const char *end, uint64_t *val)
{
	unsigned int base = 10;
	uint64_t v = 0;

	if (end - s > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
		base = 16;
		s += 2;
	}
	if (s == end)
		return false;
	for (; s < end; s++) {
		int d = digit_value(*s, base);

		if (d < 0)
			return false;
		v = v * base + (uint64_t)d;
	}
	*val = v;
	return true;
}

bool cmdline_u64(const char *key, uint64_t *val)
{
	const char *s = cmdline();
	const char *limit = s + CMDLINE_MAX;

	/* The VMM caps the line at 4 KiB; never trust it to be terminated. */
	while (s < limit && *s) {
		const char *tok, *k, *end;

		while (s < limit && is_space(*s))
			s++;
		tok = s;
		while (s < limit && *s && !is_space(*s))
			s++;
		end = s;

		for (k = key; *k && tok < end && *tok == *k; k++)
			tok++;
		if (*k || tok >= end || *tok != '=')
			continue;
		return parse_u64(tok + 1, end, val);
	}
	return false;
}
