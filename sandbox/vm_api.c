/* The control API's backend for a real VM: state, pause/resume, Ctrl-Alt-Del, dirty pages. */
#include "sandbox/vm_api.h"

#include <errno.h>
#include <stdlib.h>

#include "vmm/dirty_log.h"

#ifndef COVE_VERSION
#define COVE_VERSION "unknown"
#endif

static int be_info(void *opaque, struct api_vm_info *out)
{
	struct vm *vm = opaque;
	out->state = vm_state_name(vm_get_state(vm));
	out->vcpus = vm->nr_vcpus;
	out->mem_bytes = vm->mem.size;
	out->version = COVE_VERSION;
	return 0;
}

static int be_pause(void *opaque)
{
	return vm_pause(opaque);
}

static int be_resume(void *opaque)
{
	return vm_resume(opaque);
}

static int be_cad(void *opaque)
{
	struct vm *vm = opaque;
	if (!vm->host.send_ctrl_alt_del)
		return -ENOTSUP;
	if (vm_get_state(vm) != VM_RUNNING)
		return -EBUSY;
	return vm->host.send_ctrl_alt_del(vm->host.reset_dev);
}

static int be_dirty(void *opaque, struct api_dirty_range *out, size_t max, size_t *nr)
{
	struct vm *vm = opaque;
	size_t words = dirty_log_bitmap_words(vm);
	uint64_t *bm = calloc(words, sizeof(uint64_t));
	if (!bm)
		return -ENOMEM;
	int r = dirty_log_collect(vm, bm);
	if (r) {
		free(bm);
		return r;
	}
	/* Bitmap bits are memfd pages; report guest frame numbers, which differ above the hole. */
	size_t n = 0;
	int ret = 0;
	for (uint32_t si = 0; si < vm->mem.nr_slots; si++) {
		const struct mem_slot *s = &vm->mem.slots[si];
		uint64_t first = s->file_off >> PAGE_SHIFT, count = s->size >> PAGE_SHIFT;
		for (uint64_t p = first; p < first + count; p++) {
			if (!bm[p / 64]) {
				p |= 63; /* skip a clean word */
				continue;
			}
			if (!(bm[p / 64] & (1ULL << (p % 64))))
				continue;
			uint64_t pfn = (s->gpa >> PAGE_SHIFT) + (p - first);
			if (n > 0 && out[n - 1].first_pfn + out[n - 1].nr_pages == pfn) {
				out[n - 1].nr_pages++;
			} else if (n < max) {
				out[n++] = (struct api_dirty_range){ .first_pfn = pfn, .nr_pages = 1 };
			} else {
				ret = -E2BIG;
			}
		}
	}
	free(bm);
	*nr = n;
	return ret;
}

void vm_api_backend(struct vm *vm, struct api_backend *be)
{
	*be = (struct api_backend){
		.opaque = vm,
		.get_info = be_info,
		.pause = be_pause,
		.resume = be_resume,
		.ctrl_alt_del = be_cad,
		.dirty_pages = be_dirty,
	};
}
