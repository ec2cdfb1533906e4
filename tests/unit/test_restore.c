/* Unit tests of snapshot/restore.c: open and validate refuse bad chains without a VM. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "chain_fixture.h"
#include "snapshot/keyfile.h"
#include "snapshot/restore.h"
#include "vmm/vm.h"

static int setup(void **state)
{
	return fx_setup(state, "restore");
}

static int teardown(void **state)
{
	return fx_teardown(state);
}

/* Open then validate, as restore does; the error (if any) is one line naming `needle`. */
static int open_validate(const struct snap_restore_args *a, struct snap_restore *sr, char *err,
			 size_t errlen)
{
	memset(sr, 0, sizeof(*sr));
	err[0] = 0;
	int r = snap_restore_open(sr, a, err, errlen);
	if (!r)
		r = snap_restore_validate(sr, a, err, errlen);
	return r;
}

static void expect_refused(const struct snap_restore_args *a, int want, const char *needle)
{
	struct snap_restore sr;
	char err[512];
	int r = open_validate(a, &sr, err, sizeof(err));
	if (r != want || !strstr(err, needle))
		fail_msg("r=%d (want %d), err '%s' (want '%s')", r, want, err, needle);
	assert_null(strchr(err, '\n'));
	snap_restore_close(&sr);
}

static void test_good_chain(void **state)
{
	struct chain_fx *f = *state;
	struct snap_restore_args a = {.dir = f->dir};
	struct snap_restore sr;
	char err[512];
	assert_int_equal(open_validate(&a, &sr, err, sizeof(err)), 0);
	assert_int_equal(sr.idx, 2);
	assert_true(snap_restore_is_latest(&sr));
	assert_false(sr.encrypted);
	assert_non_null(sr.config);
	assert_memory_equal(sr.config->payload, "{\"fixture\":true}", 16);
	assert_int_equal(sr.ls->nr, 3);
	int fd;
	uint64_t off;
	snap_restore_ram_backing(&sr, &fd, &off);
	assert_int_equal(fd, sr.ls->layers[0].fd);
	assert_int_equal(off, sr.ls->layers[0].info.data_off);

	/* RAM as restore builds it: the base (here read, not mapped), then the increments. */
	uint8_t *ram = malloc(FX_PAGES * MEM_LAYER_PAGE);
	assert_non_null(ram);
	assert_int_equal(pread(fd, ram, FX_PAGES * MEM_LAYER_PAGE, (off_t)off),
			 FX_PAGES * MEM_LAYER_PAGE);
	struct vm vm;
	memset(&vm, 0, sizeof(vm));
	vm.mem.host = ram;
	vm.mem.size = FX_PAGES * MEM_LAYER_PAGE;
	uint64_t copied = 99;
	assert_int_equal(snap_restore_apply_ram(&sr, &vm, NULL, &copied, err, sizeof(err)), 0);
	assert_int_equal(copied, 4); /* two pages in each increment */
	for (uint64_t p = 0; p < FX_PAGES; p++) {
		assert_int_equal(ram[p * MEM_LAYER_PAGE], fx_expect(2, p));
		assert_int_equal(ram[p * MEM_LAYER_PAGE + MEM_LAYER_PAGE - 1], fx_expect(2, p));
	}
	free(ram);
	snap_restore_close(&sr);
	snap_restore_close(&sr); /* closing twice is harmless */
}

static void test_pick_layer(void **state)
{
	struct chain_fx *f = *state;
	struct snap_restore_args a = {.dir = f->dir, .layer = 2};
	struct snap_restore sr;
	char err[512];
	assert_int_equal(open_validate(&a, &sr, err, sizeof(err)), 0);
	assert_int_equal(sr.idx, 1);
	assert_false(snap_restore_is_latest(&sr));
	assert_int_equal(sr.ls->nr, 2);
	snap_restore_close(&sr);
	a.layer = 9;
	expect_refused(&a, -ENOENT, "has no layer 9");
}

static void test_no_chain(void **state)
{
	struct chain_fx *f = *state;
	char empty[80];
	snprintf(empty, sizeof(empty), "%s/none", f->dir);
	assert_int_equal(mkdir(empty, 0700), 0);
	struct snap_restore_args a = {.dir = empty};
	expect_refused(&a, -ENOENT, "no chain.json");
	rmdir(empty);
}

/* A layer whose header names another parent than chain.json is refused by validate. */
static void test_bad_parent(void **state)
{
	struct chain_fx *f = *state;
	fx_write_layer(&f->c, 2, 1); /* chain.json says parent 2 */
	struct snap_restore_args a = {.dir = f->dir};
	expect_refused(&a, -EINVAL, "parent does not match chain.json");
	/* An older layer does not need the bad one. */
	a.layer = 2;
	struct snap_restore sr;
	char err[512];
	assert_int_equal(open_validate(&a, &sr, err, sizeof(err)), 0);
	snap_restore_close(&sr);
}

/* A layer of another chain (another chain id) is refused. */
static void test_foreign_layer(void **state)
{
	struct chain_fx *f = *state;
	struct chain other = f->c;
	other.chain_id[0] ^= 1;
	fx_write_layer(&other, 1, 1);
	struct snap_restore_args a = {.dir = f->dir};
	expect_refused(&a, -EINVAL, "mem-1");
}

static void test_missing_or_short_layer(void **state)
{
	struct chain_fx *f = *state;
	char path[200];
	snprintf(path, sizeof(path), "%s/mem-1", f->dir);
	assert_int_equal(truncate(path, 8192), 0);
	struct snap_restore_args a = {.dir = f->dir};
	expect_refused(&a, -EINVAL, "mem-1");
	assert_int_equal(unlink(path), 0);
	struct snap_restore sr;
	char err[512];
	assert_int_not_equal(open_validate(&a, &sr, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "mem-1"));
	snap_restore_close(&sr);
}

/* A damaged state file, or one without a machine description, is refused by open. */
static void test_bad_state(void **state)
{
	struct chain_fx *f = *state;
	char path[200];
	snprintf(path, sizeof(path), "%s/state-2", f->dir);
	uint8_t b = 0xff;
	fx_write(path, &b, 1, 40, false);
	struct snap_restore_args a = {.dir = f->dir};
	struct snap_restore sr;
	char err[512];
	memset(&sr, 0, sizeof(sr));
	assert_int_not_equal(snap_restore_open(&sr, &a, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "state-2"));
	assert_null(sr.ls); /* refused before any layer is opened */
	snap_restore_close(&sr);

	fx_write_state(&f->c, 2, true);
	expect_refused(&a, -EINVAL, "no machine description");
	assert_int_equal(unlink(path), 0);
	memset(&sr, 0, sizeof(sr));
	assert_int_not_equal(snap_restore_open(&sr, &a, err, sizeof(err)), 0);
	snap_restore_close(&sr);
}

/* A keys file makes the chain encrypted: the host must name the provider, never the chain. */
static void test_encrypted_needs_key(void **state)
{
	struct chain_fx *f = *state;
	char path[200];
	snprintf(path, sizeof(path), "%s/%s", f->dir, KEYFILE_NAME);
	fx_write(path, "{}", 2, 0, true);
	struct snap_restore_args a = {.dir = f->dir};
	expect_refused(&a, -EINVAL, "give its key provider with --key");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_good_chain, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_pick_layer, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_no_chain, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_bad_parent, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_foreign_layer, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_missing_or_short_layer, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_bad_state, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_encrypted_needs_key, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
