/* Unit tests for devices/serial: the 16550 register model. */
#include "helpers.h"
#include "devices/serial.h"

static uint8_t sread(struct serial *s, uint64_t off)
{
	uint8_t v;
	serial_io_read(s, off, &v, 1);
	return v;
}

static void swrite(struct serial *s, uint64_t off, uint8_t v)
{
	serial_io_write(s, off, &v, 1);
}

static void test_serial_regs(void **state)
{
	(void)state;
	struct serial s;
	assert_int_equal(serial_create(&s, NULL, -1), 0);
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
	swrite(&s, 1, 0x02);
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
	serial_destroy(&s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_serial_regs),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
