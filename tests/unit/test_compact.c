/* Unit tests of snapshot/compact.c: a chain merged into one full layer holds the latest RAM. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "chain_fixture.h"
#include "snapshot/compact.h"
#include "snapshot/restore.h"

static int setup(void **state)
{
	return fx_setup(state, "compact");
}

static int teardown(void **state)
{
	return fx_teardown(state);
}

static bool exists(const char *dir, const char *name)
{
	char p[200];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return access(p, F_OK) == 0;
}

/* Every page of the chain's latest memory, read through restore's open and validate. */
static void expect_ram(const char *dir, int upto)
{
	struct snap_restore_args a = {.dir = dir};
	struct snap_restore sr;
	memset(&sr, 0, sizeof(sr));
	char err[512] = "";
	if (snap_restore_open(&sr, &a, err, sizeof(err)) ||
	    snap_restore_validate(&sr, &a, err, sizeof(err)))
		fail_msg("%s", err);
	assert_int_equal(sr.ls->nr, 1);
	const struct mem_layer *l = &sr.ls->layers[0];
	assert_true(l->info.flags & MEM_LAYER_FULL);
	for (uint64_t p = 0; p < FX_PAGES; p++) {
		uint8_t b[2];
		off_t o = (off_t)(l->info.data_off + p * MEM_LAYER_PAGE);
		assert_int_equal(pread(l->fd, &b[0], 1, o), 1);
		assert_int_equal(pread(l->fd, &b[1], 1, o + MEM_LAYER_PAGE - 1), 1);
		assert_int_equal(b[0], fx_expect(upto, p));
		assert_int_equal(b[1], fx_expect(upto, p));
	}
	snap_restore_close(&sr);
}

static void test_compact_chain(void **state)
{
	struct chain_fx *f = *state;
	char err[512] = "";
	struct chain c = f->c;
	assert_int_equal(chain_compact(&c, err, sizeof(err)), 0);
	assert_int_equal(c.nr_layers, 1);
	assert_int_equal(c.layers[0].id, 3);
	assert_int_equal(c.layers[0].parent, 0);
	assert_true(c.layers[0].full);
	assert_string_equal(c.layers[0].mem, "mem-000003-c");
	assert_string_equal(c.layers[0].state, "state-2"); /* the latest state file is kept */
	assert_int_equal(c.layers[0].present, FX_PAGES);
	assert_int_equal(c.layers[0].stored, FX_PAGES);
	assert_memory_equal(c.chain_id, f->c.chain_id, 16);
	/* chain.json says the same; old files stay (clones may map them), no temporary left. */
	struct chain l;
	assert_int_equal(chain_load(f->dir, &l, err, sizeof(err)), 0);
	assert_int_equal(l.nr_layers, 1);
	assert_string_equal(l.layers[0].mem, "mem-000003-c");
	assert_true(exists(f->dir, "mem-0") && exists(f->dir, "mem-1") && exists(f->dir, "mem-2"));
	assert_false(exists(f->dir, ".mem-000003-c.tmp"));
	expect_ram(f->dir, 2);
}

static void test_compact_single_layer(void **state)
{
	struct chain_fx *f = *state;
	char err[512] = "";
	struct chain c = f->c;
	c.nr_layers = 1;
	assert_int_equal(chain_compact(&c, err, sizeof(err)), 0);
	assert_int_equal(c.nr_layers, 1);
	assert_string_equal(c.layers[0].mem, "mem-0");
}

/* A bad increment: compaction fails with one line, chain.json and *c stay as they were. */
static void test_compact_bad_layer(void **state)
{
	struct chain_fx *f = *state;
	fx_write_layer(&f->c, 2, 1); /* chain.json says parent 2 */
	char err[512] = "";
	struct chain c = f->c;
	assert_int_equal(chain_compact(&c, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "mem-2"));
	assert_null(strchr(err, '\n'));
	assert_int_equal(c.nr_layers, 3);
	struct chain l;
	assert_int_equal(chain_load(f->dir, &l, err, sizeof(err)), 0);
	assert_int_equal(l.nr_layers, 3);
	assert_false(exists(f->dir, "mem-000003-c"));
	assert_false(exists(f->dir, ".mem-000003-c.tmp"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_compact_chain, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_compact_single_layer, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_compact_bad_layer, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
