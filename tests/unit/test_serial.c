/* Unit tests for devices/serial: the 16550 register model, through the port bus. */
#include "helpers.h"
#include "devices/serial.h"
#include "host_fake.h"

static struct host_fake hf;

#define sread(s, off)	  host_fake_in(&hf, SERIAL_COM1_BASE + (off))
#define swrite(s, off, v) host_fake_out(&hf, SERIAL_COM1_BASE + (off), (v))

static void test_serial_regs(void **state)
{
	(void)state;
	struct serial s;
	assert_int_equal(host_fake_init(&hf, NULL), 0);
	assert_int_equal(serial_create(&s, &hf.host, -1), 0);
	assert_int_equal(sread(&s, 5) & 0x60, 0x60); /* THRE|TEMT */
	assert_int_equal(sread(&s, 5) & 0x01, 0);    /* no data */
	swrite(&s, 7, 0x5a);
	assert_int_equal(sread(&s, 7), 0x5a);
	/* Divisor latch through DLAB. */
	swrite(&s, 3, 0x80);
	swrite(&s, 0, 0x01);
	swrite(&s, 1, 0x02);
	assert_int_equal(sread(&s, 0), 0x01);
	assert_int_equal(sread(&s, 1), 0x02);
	swrite(&s, 3, 0x03);
	assert_int_equal(sread(&s, 1), 0); /* IER, not DLM */
	/* Input shows up in LSR.DR and RBR, in order. */
	assert_int_equal(serial_push_input(&s, (const uint8_t *)"hi", 2), 2);
	assert_int_equal(sread(&s, 5) & 0x01, 1);
	swrite(&s, 1, 0x01); /* RX interrupt enabled */
	assert_int_equal(sread(&s, 2) & 0x0f, 0x04);
	assert_int_equal(sread(&s, 0), 'h');
	assert_int_equal(sread(&s, 0), 'i');
	assert_int_equal(sread(&s, 5) & 0x01, 0);
	assert_int_equal(sread(&s, 2) & 0x0f, 0x01);
	/* THRE interrupt: raised on enable, acknowledged by reading IIR. */
	int raises = hf.irq_raises[SERIAL_COM1_IRQ];
	swrite(&s, 1, 0x02);
	assert_int_equal(hf.irq_raises[SERIAL_COM1_IRQ], raises + 1);
	assert_int_equal(sread(&s, 2) & 0x0f, 0x02);
	assert_int_equal(sread(&s, 2) & 0x0f, 0x01);
	/* Loopback: transmitted bytes come back as input; MSR mirrors MCR. */
	swrite(&s, 4, 0x10 | 0x0f);
	assert_int_equal(sread(&s, 6), 0xf0);
	swrite(&s, 0, 'x');
	assert_int_equal(sread(&s, 0), 'x');
	assert_int_equal(s.tx_bytes, 0);
	/* The receive FIFO is bounded. */
	uint8_t big[SERIAL_RX_FIFO + 10];
	memset(big, 'a', sizeof(big));
	assert_int_equal(serial_push_input(&s, big, sizeof(big)), SERIAL_RX_FIFO);
	assert_int_equal(serial_rx_space(&s), 0);
	swrite(&s, 2, 0x02); /* FCR: clear receive FIFO */
	assert_int_equal(serial_rx_space(&s), SERIAL_RX_FIFO);
	/* A kernel panic line on the console is reported to the machine. */
	swrite(&s, 4, 0x08);
	const char *line = "[ 1.0] Kernel panic - not syncing: VFS\n";
	for (const char *c = line; *c; c++)
		swrite(&s, 0, (uint8_t)*c);
	assert_string_equal(hf.panic, "Kernel panic - not syncing: VFS");
	serial_destroy(&s);
	host_fake_destroy(&hf);
}

/*
 * The register sequence Linux's 8250 driver runs on a legacy COM port (autoconfig, then
 * serial8250_do_startup), with the answers a 16550A gives: a port that fails one of these
 * probes is driven as an older chip, or with UART_BUG_THRE / UART_BUG_TXEN, whose backup
 * timer paces console output by the jiffy.
 */
static void test_serial_linux_probe(void **state)
{
	(void)state;
	struct serial s;
	assert_int_equal(host_fake_init(&hf, NULL), 0);
	assert_int_equal(serial_create(&s, &hf.host, -1), 0);
	/* autoconfig: IER holds exactly the four interrupt-enable bits. */
	uint8_t saved_ier = (uint8_t)sread(&s, 1);
	swrite(&s, 1, 0);
	assert_int_equal(sread(&s, 1) & 0x0f, 0);
	swrite(&s, 1, 0x0f);
	assert_int_equal(sread(&s, 1) & 0x0f, 0x0f);
	swrite(&s, 1, saved_ier);
	/* Loopback with RTS and OUT2 set reads back CTS and DCD only. */
	uint8_t saved_mcr = (uint8_t)sread(&s, 4);
	swrite(&s, 4, 0x10 | 0x0a);
	assert_int_equal(sread(&s, 6) & 0xf0, 0x90);
	swrite(&s, 4, saved_mcr);
	/* FIFO enabled: IIR bits 7:6 read 11, the 16550A answer. */
	swrite(&s, 3, 0xbf);
	swrite(&s, 2, 0);
	swrite(&s, 3, 0);
	swrite(&s, 2, 0x01);
	assert_int_equal(sread(&s, 2) >> 6, 3);
	/* IER bit 6 (XScale UUE) does not stick, or the port would be taken for an XScale. */
	swrite(&s, 1, 0x40);
	assert_int_equal(sread(&s, 1) & 0x40, 0);
	swrite(&s, 1, 0);
	/* The scratch register keeps what was written. */
	swrite(&s, 7, 0xa5);
	assert_int_equal(sread(&s, 7), 0xa5);
	/* serial8250_do_startup: clear FIFOs, then the read-to-clear registers. */
	swrite(&s, 2, 0x01);
	swrite(&s, 2, 0x07);
	swrite(&s, 2, 0);
	assert_int_not_equal(sread(&s, 5), 0xff); /* no "LSR safety check engaged" */
	(void)sread(&s, 0);
	(void)sread(&s, 2);
	(void)sread(&s, 6);
	/*
	 * THRE test: an idle transmitter re-asserts THRE each time THRI is enabled, so both
	 * reads of IIR show it; "pending, then nothing" sets UART_BUG_THRE.
	 */
	assert_int_equal(sread(&s, 5) & 0x20, 0x20);
	swrite(&s, 1, 0x02);
	uint8_t iir1 = (uint8_t)sread(&s, 2);
	swrite(&s, 1, 0);
	swrite(&s, 1, 0x02);
	uint8_t iir = (uint8_t)sread(&s, 2);
	swrite(&s, 1, 0);
	assert_int_equal(iir1 & 0x0f, 0x02);
	assert_int_equal(iir & 0x0f, 0x02);
	/* TXEN test: with TEMT set, enabling THRI must leave an interrupt pending in IIR. */
	swrite(&s, 1, 0x02);
	uint8_t lsr = (uint8_t)sread(&s, 5);
	iir = (uint8_t)sread(&s, 2);
	swrite(&s, 1, 0);
	assert_int_equal(lsr & 0x40, 0x40);
	assert_int_equal(iir & 0x01, 0);
	/* Interrupt-driven transmit: each THR write gives the (edge) line a fresh rising edge. */
	swrite(&s, 1, 0x02);
	assert_int_equal(sread(&s, 2) & 0x0f, 0x02);
	int raises = hf.irq_raises[SERIAL_COM1_IRQ];
	for (int i = 0; i < 16; i++)
		swrite(&s, 0, 'x');
	assert_int_equal(hf.irq_raises[SERIAL_COM1_IRQ], raises + 16);
	assert_int_equal(s.tx_bytes, 16);
	assert_int_equal(sread(&s, 2) & 0x0f, 0x02);
	assert_int_equal(sread(&s, 2) & 0x0f, 0x01);
	serial_destroy(&s);
	host_fake_destroy(&hf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_serial_regs),
	    cmocka_unit_test(test_serial_linux_probe),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
