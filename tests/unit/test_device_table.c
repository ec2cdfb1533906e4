/* The device type table: every entry complete, names unique, specs round-trip through the machine
 * config. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "devices/device.h"
#include "sandbox/machine_config.h"
#include "sandbox/options.h"

static void test_entries_complete(void **state)
{
	(void)state;
	int n = 0;
	for (int i = 0; device_types[i]; i++, n++) {
		const struct device_type *t = device_types[i];
		assert_non_null(t->name);
		assert_true(t->size > 0);
		assert_non_null(t->create);
		assert_non_null(t->destroy);
		assert_non_null(t->mmio);
		assert_ptr_equal(device_type_find(t->name), t);
		/* An option needs its parser and a way into the snapshot's machine config. */
		if (t->opt_name)
			assert_true(t->opt_parse && t->opt_help && t->spec_to_json &&
				    t->spec_from_json);
		if (t->state_size)
			assert_true(t->save && t->restore && t->state_size <= DEVICE_STATE_MAX);
		for (int k = 0; k < i; k++)
			assert_string_not_equal(device_types[k]->name, t->name);
	}
	assert_true(n >= 3);
	assert_null(device_type_find("no-such-device"));
}

static void test_option_to_machine_config(void **state)
{
	(void)state;
	char *argv[] = {"run", "--kernel", "k", "--rng=5000", "--rng", NULL};
	struct run_opts o;
	char err[256];
	assert_int_equal(run_opts_parse(5, argv, &o, err, sizeof(err)), 0);
	assert_int_equal(o.nr_devs, 2);
	char *bad[] = {"run", "--kernel", "k", "--rng=x", NULL};
	assert_int_equal(run_opts_parse(4, bad, &o, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "--rng"));
	assert_int_equal(run_opts_parse(5, argv, &o, err, sizeof(err)), 0);

	struct machine_config *mc = calloc(1, sizeof(*mc)), *back = calloc(1, sizeof(*back));
	mc->mem_size = 2 << 20;
	mc->vcpus = 1;
	mc->nr_devs = o.nr_devs;
	memcpy(mc->devs, o.devs, sizeof(mc->devs));
	char *json = machine_config_to_json(mc);
	assert_non_null(json);
	assert_non_null(strstr(json, "\"devices\""));
	assert_int_equal(machine_config_parse(json, strlen(json), back, err, sizeof(err)), 0);
	assert_int_equal(back->nr_devs, 2);
	for (int i = 0; i < 2; i++) {
		assert_ptr_equal(back->devs[i].type, mc->devs[i].type);
		assert_memory_equal(back->devs[i].cfg, mc->devs[i].cfg, DEVICE_CFG_BYTES);
	}
	free(json);

	/* Today's snapshots have no "devices": none come back. Unknown types are refused. */
	const char *old = "{\"format\":2,\"mem_size\":2097152,\"vcpus\":1,\"disks\":[]}";
	assert_int_equal(machine_config_parse(old, strlen(old), back, err, sizeof(err)), 0);
	assert_int_equal(back->nr_devs, 0);
	const char *unknown = "{\"format\":2,\"mem_size\":2097152,\"vcpus\":1,\"disks\":[],"
			      "\"devices\":[{\"type\":\"virtio-gpu\"}]}";
	assert_int_equal(machine_config_parse(unknown, strlen(unknown), back, err, sizeof(err)),
			 -EINVAL);
	const char *badrate = "{\"format\":2,\"mem_size\":2097152,\"vcpus\":1,\"disks\":[],"
			      "\"devices\":[{\"type\":\"virtio-rng\",\"rate\":0,\"burst\":1}]}";
	assert_int_equal(machine_config_parse(badrate, strlen(badrate), back, err, sizeof(err)),
			 -EINVAL);
	free(mc);
	free(back);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_entries_complete),
	    cmocka_unit_test(test_option_to_machine_config),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
