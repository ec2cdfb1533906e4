/* Dirty page tracking: KVM_GET_DIRTY_LOG/KVM_CLEAR_DIRTY_LOG per slot, merged with the VMM's bitmap. */
#include "vmm/dirty_log.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "vmm/kvm_util.h"
#include "vmm/vm.h"

int dirty_log_enable(struct vm *vm)
{
	int r = kvm_ioctl_raw(vm->kvm_fd, KVM_CHECK_EXTENSION,
			      (void *)(long)KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2);
	if (r <= 0)
		return 0; /* Older KVM: GET_DIRTY_LOG clears as it reads; still correct. */
	struct kvm_enable_cap cap = {
		.cap = KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2,
		/* Not INITIALLY_SET: the first collection reports only pages written since boot. */
		.args = { KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE },
	};
	r = KVM_IOCTL(vm->log, vm->vm_fd, KVM_ENABLE_CAP, &cap);
	if (r)
		return r;
	vm->dirty_manual = true;
	return 0;
}

size_t dirty_log_bitmap_words(const struct vm *vm)
{
	return (size_t)(((vm->mem.size >> PAGE_SHIFT) + 63) / 64);
}

static int collect(struct vm *vm, uint64_t *bitmap, bool with_vmm)
{
	if (!vm->track_dirty)
		return -ENODATA;
	size_t words = dirty_log_bitmap_words(vm);
	memset(bitmap, 0, words * sizeof(uint64_t));
	for (uint32_t i = 0; i < vm->mem.nr_slots; i++) {
		const struct mem_slot *s = &vm->mem.slots[i];
		uint64_t npages = s->size >> PAGE_SHIFT;
		size_t swords = (size_t)((npages + 63) / 64);
		uint64_t *tmp = calloc(swords, sizeof(uint64_t));
		if (!tmp)
			return -ENOMEM;
		struct kvm_dirty_log dl = { .slot = s->id, .dirty_bitmap = tmp };
		int r = KVM_IOCTL(vm->log, vm->vm_fd, KVM_GET_DIRTY_LOG, &dl);
		if (!r && vm->dirty_manual) {
			/* Re-protect exactly what we are about to report, so no write is lost. */
			struct kvm_clear_dirty_log cl = {
				.slot = s->id,
				.num_pages = (uint32_t)npages,
				.first_page = 0,
				.dirty_bitmap = tmp,
			};
			r = KVM_IOCTL(vm->log, vm->vm_fd, KVM_CLEAR_DIRTY_LOG, &cl);
		}
		if (r) {
			free(tmp);
			return r;
		}
		/* Slots start on page boundaries that are multiples of 64 pages (3 GiB), so words align. */
		size_t base = (size_t)(s->file_off >> PAGE_SHIFT) / 64;
		for (size_t w = 0; w < swords && base + w < words; w++)
			bitmap[base + w] |= tmp[w];
		free(tmp);
	}
	if (!with_vmm)
		return 0;
	pthread_mutex_lock(&vm->dirty_lock);
	for (size_t w = 0; w < words; w++) {
		/* Write only non-zero words: touching the whole bitmap would cost RSS. */
		if (vm->vmm_dirty[w]) {
			bitmap[w] |= vm->vmm_dirty[w];
			vm->vmm_dirty[w] = 0;
		}
	}
	pthread_mutex_unlock(&vm->dirty_lock);
	return 0;
}

int dirty_log_collect(struct vm *vm, uint64_t *bitmap)
{
	return collect(vm, bitmap, true);
}

int dirty_log_collect_kvm(struct vm *vm, uint64_t *bitmap)
{
	return collect(vm, bitmap, false);
}

int dirty_log_start(struct vm *vm)
{
	if (vm->track_dirty)
		return 0;
	for (uint32_t i = 0; i < vm->mem.nr_slots; i++) {
		const struct mem_slot *s = &vm->mem.slots[i];
		struct kvm_userspace_memory_region region = {
			.slot = s->id,
			.flags = KVM_MEM_LOG_DIRTY_PAGES,
			.guest_phys_addr = s->gpa,
			.memory_size = s->size,
			.userspace_addr = (uint64_t)(uintptr_t)(vm->mem.host + s->file_off),
		};
		int r = KVM_IOCTL(vm->log, vm->vm_fd, KVM_SET_USER_MEMORY_REGION, &region);
		if (r)
			return r;
	}
	vm->track_dirty = true;
	return 0;
}

void dirty_log_merge_back(struct vm *vm, const uint64_t *bitmap)
{
	size_t words = dirty_log_bitmap_words(vm);
	pthread_mutex_lock(&vm->dirty_lock);
	for (size_t w = 0; w < words; w++)
		if (bitmap[w])
			vm->vmm_dirty[w] |= bitmap[w];
	pthread_mutex_unlock(&vm->dirty_lock);
}

int64_t dirty_log_count(struct vm *vm)
{
	if (!vm->track_dirty || !vm->dirty_manual)
		return -ENOTSUP;
	uint64_t n = 0;
	for (uint32_t i = 0; i < vm->mem.nr_slots; i++) {
		const struct mem_slot *s = &vm->mem.slots[i];
		size_t swords = (size_t)(((s->size >> PAGE_SHIFT) + 63) / 64);
		uint64_t *tmp = calloc(swords, sizeof(uint64_t));
		if (!tmp)
			return -ENOMEM;
		/* With manual protection GET only reads: nothing is cleared or re-protected. */
		struct kvm_dirty_log dl = { .slot = s->id, .dirty_bitmap = tmp };
		int r = kvm_ioctl_raw(vm->vm_fd, KVM_GET_DIRTY_LOG, &dl);
		for (size_t w = 0; !r && w < swords; w++)
			n += (uint64_t)__builtin_popcountll(tmp[w]);
		free(tmp);
		if (r)
			return r;
	}
	size_t words = dirty_log_bitmap_words(vm);
	pthread_mutex_lock(&vm->dirty_lock);
	for (size_t w = 0; w < words; w++)
		if (vm->vmm_dirty[w])
			n += (uint64_t)__builtin_popcountll(vm->vmm_dirty[w]);
	pthread_mutex_unlock(&vm->dirty_lock);
	return (int64_t)n;
}

int dirty_log_discard(struct vm *vm, uint64_t gpa, uint64_t len)
{
	pthread_mutex_lock(&vm->dirty_lock);
	int r = guest_mem_discard(&vm->mem, gpa, len);
	/* guest_mem_discard took only a range inside one slot: its pages are consecutive. */
	int64_t first = r ? -1 : guest_mem_page_index(&vm->mem, gpa);
	for (uint64_t i = 0; first >= 0 && i < len / PAGE_SIZE; i++) {
		uint64_t idx = (uint64_t)first + i;
		vm->vmm_dirty[idx / 64] |= 1ULL << (idx % 64);
		if (vm->discarded)
			vm->discarded[idx / 64] |= 1ULL << (idx % 64);
	}
	pthread_mutex_unlock(&vm->dirty_lock);
	return r;
}

void dirty_log_peek_discarded(struct vm *vm, uint64_t *out)
{
	size_t words = dirty_log_bitmap_words(vm);
	pthread_mutex_lock(&vm->dirty_lock);
	for (size_t w = 0; w < words; w++)
		out[w] = vm->discarded ? vm->discarded[w] : 0;
	pthread_mutex_unlock(&vm->dirty_lock);
}

void dirty_log_clear_discarded(struct vm *vm, const uint64_t *bitmap)
{
	size_t words = dirty_log_bitmap_words(vm);
	pthread_mutex_lock(&vm->dirty_lock);
	for (size_t w = 0; vm->discarded && w < words; w++)
		if (vm->discarded[w] & bitmap[w])
			vm->discarded[w] &= ~bitmap[w];
	pthread_mutex_unlock(&vm->dirty_lock);
}
