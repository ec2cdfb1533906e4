/* Unit tests for devices/i8042: the keyboard controller register model, through the port bus. */
#include "helpers.h"
#include "devices/i8042.h"
#include "host_fake.h"

static struct host_fake hf;

#define kread(k, off)	  host_fake_in(&hf, I8042_BASE + (off))
#define kwrite(k, off, v) host_fake_out(&hf, I8042_BASE + (off), (v))

static void test_i8042(void **state)
{
	(void)state;
	struct i8042 k;
	assert_int_equal(host_fake_init(&hf, NULL), 0);
	assert_int_equal(i8042_create(&k, &hf.host), 0);
	assert_int_equal(kread(&k, 4) & 0x01, 0);
	kwrite(&k, 4, 0xaa); /* self test */
	assert_int_equal(kread(&k, 4) & 0x01, 1);
	assert_int_equal(kread(&k, 0), 0x55);
	kwrite(&k, 4, 0x60); /* write CTR */
	kwrite(&k, 0, 0x05); /* no translation */
	kwrite(&k, 4, 0x20);
	assert_int_equal(kread(&k, 0), 0x05);
	assert_int_equal(i8042_send_ctrl_alt_del(&k), 0);
	assert_true(hf.irq_raises[I8042_IRQ] > 0);
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
	assert_int_equal(hf.stops, 1);
	assert_string_equal(hf.stop_reason, "guest requested reset via i8042");
	k.reset_requested = 0;
	kwrite(&k, 4, 0xfe);
	assert_int_equal(k.reset_requested, 1);
	assert_int_equal(hf.stops, 2);
	i8042_destroy(&k);
	host_fake_destroy(&hf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_i8042),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
