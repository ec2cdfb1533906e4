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

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_serial_regs),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
