/* Guest physical memory: memfd-backed RAM split into KVM slots around the 32-bit MMIO hole. */
#include "vmm/guest_mem.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int guest_mem_layout(uint64_t size, struct mem_slot *slots, uint32_t *nr_slots)
{
	if (size < MEM_MIN_SIZE || size > MEM_MAX_SIZE || size % PAGE_SIZE)
		return -EINVAL;
	uint64_t low = size < MMIO_HOLE_START ? size : MMIO_HOLE_START;
	slots[0] = (struct mem_slot){ .id = 0, .gpa = 0, .size = low, .file_off = 0 };
	*nr_slots = 1;
	if (size > low) {
		slots[1] = (struct mem_slot){
			.id = 1, .gpa = MMIO_HOLE_END, .size = size - low, .file_off = low
		};
		*nr_slots = 2;
	}
	return 0;
}

int guest_mem_create(struct guest_mem *mem, uint64_t size)
{
	return guest_mem_create_from(mem, size, -1, 0);
}

int guest_mem_create_from(struct guest_mem *mem, uint64_t size, int file_fd, uint64_t file_off)
{
	memset(mem, 0, sizeof(*mem));
	mem->fd = -1;
	int r = guest_mem_layout(size, mem->slots, &mem->nr_slots);
	if (r)
		return r;
	int map_fd = file_fd;
	int flags = MAP_PRIVATE;
	if (file_fd < 0) {
		mem->fd = memfd_create("cove-guest-ram", MFD_CLOEXEC);
		if (mem->fd < 0)
			return -errno;
		/* ftruncate only sets the size: no page exists until the guest touches it. */
		if (ftruncate(mem->fd, (off_t)size) < 0) {
			r = -errno;
			goto err_close;
		}
		map_fd = mem->fd;
		flags = MAP_SHARED;
		file_off = 0;
	} else {
		mem->private_file = true;
	}
	/*
	 * Map at a 2 MiB-aligned address so host and guest addresses agree modulo
	 * 2 MiB: only then can KVM back guest memory with huge pages.  Reserve a
	 * little more address space, then place the memfd inside it.
	 */
	uint8_t *resv = mmap(NULL, size + HUGE_PAGE_SIZE, PROT_NONE,
			     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (resv == MAP_FAILED) {
		r = -errno;
		goto err_close;
	}
	uint8_t *aligned = (uint8_t *)(((uintptr_t)resv + HUGE_PAGE_SIZE - 1) & ~(HUGE_PAGE_SIZE - 1));
	void *p = mmap(aligned, size, PROT_READ | PROT_WRITE, flags | MAP_NORESERVE | MAP_FIXED,
		       map_fd, (off_t)file_off);
	if (p == MAP_FAILED) {
		r = -errno;
		munmap(resv, size + HUGE_PAGE_SIZE);
		goto err_close;
	}
	if (aligned > resv)
		munmap(resv, (size_t)(aligned - resv));
	if (aligned + size < resv + size + HUGE_PAGE_SIZE)
		munmap(aligned + size, (size_t)(resv + size + HUGE_PAGE_SIZE - (aligned + size)));
	/* Guest RAM never belongs in a core dump of the VMM. */
	(void)madvise(p, size, MADV_DONTDUMP);
	/*
	 * Ask for transparent huge pages: fewer TLB misses for the guest.  Takes
	 * effect where the host allows it for shared memory
	 * (/sys/kernel/mm/transparent_hugepage/shmem_enabled = advise); harmless elsewhere.
	 */
	(void)madvise(p, size, MADV_HUGEPAGE);
	mem->host = p;
	mem->size = size;
	return 0;

err_close:
	if (mem->fd >= 0)
		close(mem->fd);
	mem->fd = -1;
	return r;
}

void guest_mem_destroy(struct guest_mem *mem)
{
	if (mem->host)
		munmap(mem->host, mem->size);
	if (mem->fd >= 0)
		close(mem->fd);
	mem->host = NULL;
	mem->fd = -1;
}

uint64_t guest_mem_end(const struct guest_mem *mem)
{
	if (mem->nr_slots == 0)
		return 0;
	const struct mem_slot *s = &mem->slots[mem->nr_slots - 1];
	return s->gpa + s->size;
}

static const struct mem_slot *slot_of(const struct guest_mem *mem, uint64_t gpa, uint64_t len)
{
	for (uint32_t i = 0; i < mem->nr_slots; i++) {
		const struct mem_slot *s = &mem->slots[i];
		/* Written as subtractions so no sum can wrap. */
		if (gpa >= s->gpa && gpa - s->gpa < s->size && len <= s->size - (gpa - s->gpa))
			return s;
	}
	return NULL;
}

void *guest_mem_ptr(const struct guest_mem *mem, uint64_t gpa, uint64_t len)
{
	if (!mem->host)
		return NULL;
	const struct mem_slot *s = slot_of(mem, gpa, len ? len : 1);
	if (!s)
		return NULL;
	return mem->host + s->file_off + (gpa - s->gpa);
}

int64_t guest_mem_page_index(const struct guest_mem *mem, uint64_t gpa)
{
	const struct mem_slot *s = slot_of(mem, gpa, 1);
	if (!s)
		return -1;
	return (int64_t)((s->file_off + (gpa - s->gpa)) >> PAGE_SHIFT);
}

int guest_mem_discard(const struct guest_mem *mem, uint64_t gpa, uint64_t len)
{
	if (!mem->host || !len || (gpa | len) & (PAGE_SIZE - 1))
		return -EINVAL;
	const struct mem_slot *s = slot_of(mem, gpa, len);
	if (!s)
		return -EINVAL;
	uint64_t off = s->file_off + (gpa - s->gpa);
	if (mem->fd >= 0) {
		/*
		 * Shared memfd: MADV_DONTNEED would only drop this mapping's page table entries and
		 * free nothing. A punched hole frees the pages (KVM's MMU notifier drops its own
		 * mappings of them); reads see zeros, and a userfaultfd-registered range (lazy
		 * restore) faults into its handler again, which serves the layer's page: old bytes
		 * of a free page, which the guest does not read before it writes.
		 */
		if (fallocate(mem->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off,
			      (off_t)len) < 0)
			return -errno;
		return 0;
	}
	/*
	 * Private mapping of a snapshot layer (a restored sandbox): MADV_DONTNEED would free the
	 * copy-on-write copy but let the range read back the layer's old bytes from the page
	 * cache, and the next snapshot would then store those old bytes again. Fresh anonymous
	 * memory over the range frees the copy and reads as zeros (the shared zero page, no
	 * memory) until the guest writes: what a memfd hole gives. KVM's slot keeps its host
	 * address; the MMU notifier of the replaced range drops its old mappings.
	 */
	uint8_t *p = mem->host + off;
	void *q = mmap(p, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
	if (q == MAP_FAILED) {
		/* Out of mappings (vm.max_map_count): still free the copy; old bytes read back. */
		int e = -errno;
		return madvise(p, len, MADV_DONTNEED) < 0 ? -errno : e;
	}
	(void)madvise(p, len, MADV_DONTDUMP);
	return 0;
}
