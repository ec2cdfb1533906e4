/* Unit tests of vmm/dirty_log.c without KVM: the VMM's own bitmap in collect, and merge-back. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "vmm/dirty_log.h"
#include "vmm/vm.h"

#define PAGES 200 /* not a multiple of 64: the last word is partial */

/* A VM with RAM but no memory slots: KVM's log is empty, only the VMM's bitmap counts. */
static int setup(void **state)
{
	struct vm *vm = calloc(1, sizeof(*vm));
	if (!vm)
		return -1;
	vm->mem.size = (uint64_t)PAGES * PAGE_SIZE;
	vm->vmm_dirty = calloc(dirty_log_bitmap_words(vm), sizeof(uint64_t));
	pthread_mutex_init(&vm->dirty_lock, NULL);
	vm->track_dirty = true;
	*state = vm;
	return vm->vmm_dirty ? 0 : -1;
}

static int teardown(void **state)
{
	struct vm *vm = *state;
	pthread_mutex_destroy(&vm->dirty_lock);
	free(vm->vmm_dirty);
	free(vm);
	return 0;
}

static void set_bit(uint64_t *bm, uint64_t p)
{
	bm[p / 64] |= 1ULL << (p % 64);
}

static void test_words(void **state)
{
	struct vm *vm = *state;
	assert_int_equal(dirty_log_bitmap_words(vm), 4);
	vm->mem.size = 64 * PAGE_SIZE;
	assert_int_equal(dirty_log_bitmap_words(vm), 1);
	vm->mem.size = 0;
	assert_int_equal(dirty_log_bitmap_words(vm), 0);
}

static void test_collect_needs_tracking(void **state)
{
	struct vm *vm = *state;
	uint64_t bm[4];
	vm->track_dirty = false;
	assert_int_equal(dirty_log_collect(vm, bm), -ENODATA);
	/* Without manual protection a count would clear KVM's log: refused. */
	vm->track_dirty = true;
	assert_int_equal(dirty_log_count(vm), -ENOTSUP);
}

/* Collect overwrites the bitmap with the VMM's pages and clears them; a second one is empty. */
static void test_collect_vmm_pages(void **state)
{
	struct vm *vm = *state;
	static const uint64_t pages[] = {0, 63, 64, 130, PAGES - 1};
	for (size_t i = 0; i < sizeof(pages) / sizeof(pages[0]); i++)
		set_bit(vm->vmm_dirty, pages[i]);
	uint64_t bm[4], want[4] = {0};
	memset(bm, 0xa5, sizeof(bm));
	for (size_t i = 0; i < sizeof(pages) / sizeof(pages[0]); i++)
		set_bit(want, pages[i]);
	assert_int_equal(dirty_log_collect(vm, bm), 0);
	assert_memory_equal(bm, want, sizeof(bm));
	for (size_t w = 0; w < 4; w++)
		assert_int_equal(vm->vmm_dirty[w], 0);
	assert_int_equal(dirty_log_collect(vm, bm), 0);
	for (size_t w = 0; w < 4; w++)
		assert_int_equal(bm[w], 0);
}

/* A failed snapshot merges its pages back: the next collect has them and the new ones. */
static void test_merge_back(void **state)
{
	struct vm *vm = *state;
	uint64_t failed[4] = {0}, bm[4], want[4] = {0};
	set_bit(failed, 5);
	set_bit(failed, 70);
	set_bit(vm->vmm_dirty, 70); /* written again meanwhile */
	set_bit(vm->vmm_dirty, 199);
	dirty_log_merge_back(vm, failed);
	set_bit(want, 5);
	set_bit(want, 70);
	set_bit(want, 199);
	assert_memory_equal(vm->vmm_dirty, want, sizeof(want));
	assert_int_equal(dirty_log_collect(vm, bm), 0);
	assert_memory_equal(bm, want, sizeof(bm));
	/* Merging an empty set changes nothing. */
	memset(failed, 0, sizeof(failed));
	dirty_log_merge_back(vm, failed);
	assert_int_equal(dirty_log_collect(vm, bm), 0);
	for (size_t w = 0; w < 4; w++)
		assert_int_equal(bm[w], 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_words, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_collect_needs_tracking, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_collect_vmm_pages, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_merge_back, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
