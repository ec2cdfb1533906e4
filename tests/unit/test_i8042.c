/* Unit tests for devices/i8042: the keyboard controller register model. */
#include "helpers.h"
#include "devices/i8042.h"

static uint8_t kread(struct i8042 *k, uint64_t off)
{
	uint8_t v;
	i8042_io_read(k, off, &v, 1);
	return v;
}

static void kwrite(struct i8042 *k, uint64_t off, uint8_t v)
{
	i8042_io_write(k, off, &v, 1);
}

static void test_i8042(void **state)
{
	(void)state;
	struct i8042 k;
	assert_int_equal(i8042_create(&k, NULL), 0);
	assert_int_equal(kread(&k, 4) & 0x01, 0);
	kwrite(&k, 4, 0xaa); /* self test */
	assert_int_equal(kread(&k, 4) & 0x01, 1);
	assert_int_equal(kread(&k, 0), 0x55);
	kwrite(&k, 4, 0x60); /* write CTR */
	kwrite(&k, 0, 0x05); /* no translation */
	kwrite(&k, 4, 0x20);
	assert_int_equal(kread(&k, 0), 0x05);
	assert_int_equal(i8042_send_ctrl_alt_del(&k), 0);
	assert_int_equal(kread(&k, 0), 0x14);
	assert_int_equal(kread(&k, 0), 0x11);
	assert_int_equal(kread(&k, 0), 0x71);
	kwrite(&k, 0, 0xff); /* keyboard reset: ACK + BAT ok */
	assert_int_equal(kread(&k, 0), 0xfa);
	assert_int_equal(kread(&k, 0), 0xaa);
	/* A full buffer refuses more key presses instead of overflowing. */
	for (int i = 0; i < 20; i++)
		kwrite(&k, 0, 0xf4);
	assert_int_equal(i8042_send_ctrl_alt_del(&k), -ENOSPC);
	assert_int_equal(k.reset_requested, 0);
	kwrite(&k, 4, 0xd1); /* write output port with the reset line low */
	kwrite(&k, 0, 0x00);
	assert_int_equal(k.reset_requested, 1);
	k.reset_requested = 0;
	kwrite(&k, 4, 0xfe);
	assert_int_equal(k.reset_requested, 1);
	i8042_destroy(&k);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_i8042),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
