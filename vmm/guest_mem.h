/* Guest physical memory: one memfd, mapped MAP_SHARED, split around the 32-bit MMIO hole. */
#ifndef COVE_GUEST_MEM_H
#define COVE_GUEST_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PAGE_SIZE 4096ULL
#define PAGE_SHIFT 12
#define HUGE_PAGE_SIZE (2ULL << 20)

/* [MMIO_HOLE_START, 4 GiB) is never RAM: LAPIC, IOAPIC and virtio-mmio devices live there. */
#define MMIO_HOLE_START 0xC0000000ULL
#define MMIO_HOLE_END 0x100000000ULL
#define MEM_MAX_SLOTS 2
#define MEM_MIN_SIZE (2ULL << 20)
#define MEM_MAX_SIZE (1ULL << 40)

struct mem_slot {
	uint32_t id;
	uint64_t gpa;
	uint64_t size;
	uint64_t file_off; /* offset in the memfd, equal to the offset in the host mapping */
};

struct guest_mem {
	int fd;		  /* memfd holding all of RAM */
	uint8_t *host;	  /* MAP_SHARED mapping of the whole memfd */
	uint64_t size;	  /* bytes of RAM */
	struct mem_slot slots[MEM_MAX_SLOTS];
	uint32_t nr_slots;
	/* RAM is a private copy-on-write mapping of a snapshot layer file (fd is then -1). */
	bool private_file;
};

/* Pure: split `size` bytes of RAM into slots around the MMIO hole. Returns 0 or -EINVAL. */
int guest_mem_layout(uint64_t size, struct mem_slot *slots, uint32_t *nr_slots);
/* Creates the memfd and the mapping (no page is touched). */
int guest_mem_create(struct guest_mem *mem, uint64_t size);
/*
 * Restore: RAM is `size` bytes of `file_fd` from `file_off`, mapped MAP_PRIVATE, so pages are
 * read from the file (page cache, shared between clones) only when first touched and copied
 * only when written.  The caller may close file_fd afterwards.  file_fd < 0 = a new memfd.
 */
int guest_mem_create_from(struct guest_mem *mem, uint64_t size, int file_fd, uint64_t file_off);
void guest_mem_destroy(struct guest_mem *mem);
/* Highest guest-physical address + 1 that is RAM. */
uint64_t guest_mem_end(const struct guest_mem *mem);
/*
 * The one overflow-safe check every guest address goes through: returns a host
 * pointer to [gpa, gpa+len) if that range is RAM inside one slot, else NULL.
 */
void *guest_mem_ptr(const struct guest_mem *mem, uint64_t gpa, uint64_t len);
/*
 * Gives the host the memory behind [gpa, gpa+len) (page-aligned, RAM inside one slot): the
 * guest reads zeros there afterwards. A memfd gets a hole punched; a private file mapping gets
 * fresh anonymous zero pages mapped over the range. 0, -EINVAL for a range that is not
 * page-aligned RAM, or -errno of the system call.
 */
int guest_mem_discard(const struct guest_mem *mem, uint64_t gpa, uint64_t len);
/* Offset of a guest page inside the memfd/bitmap index space; -1 if not RAM. */
int64_t guest_mem_page_index(const struct guest_mem *mem, uint64_t gpa);

#endif
