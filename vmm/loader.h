/* Kernel image loading: ELF64 executables (test guests) and flat binaries, checked against guest RAM. */
#ifndef COVE_LOADER_H
#define COVE_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "vmm/guest_mem.h"

#define LOADER_MAX_FILE (512ULL << 20)

enum kernel_kind { KERNEL_ELF, KERNEL_BZIMAGE, KERNEL_FLAT };

/* bzImage setup header: the bytes from 0x1f1 up to the end of the header. */
#define SETUP_HDR_OFF 0x1f1
#define SETUP_HDR_MAX (0x280 - SETUP_HDR_OFF)

struct kernel_image {
	enum kernel_kind kind;
	uint64_t entry;	    /* 64-bit entry point (long mode, RSI = zero page) */
	uint64_t pvh_entry; /* 32-bit PVH entry from XEN_ELFNOTE_PHYS32_ENTRY, 0 if none */
	uint64_t load_end;  /* first guest address above everything the kernel will use */
	uint8_t setup_hdr[SETUP_HDR_MAX];
	size_t setup_hdr_len;
};

/*
 * Pure over a buffer: recognises an ELF64 x86-64 executable (vmlinux or a test
 * guest: PT_LOAD segments copied to their physical addresses >= 1 MiB), a
 * bzImage (64-bit boot protocol: protected-mode code loaded at 1 MiB, entered
 * at +0x200), or else a flat binary (loaded and entered at 1 MiB).  Nothing
 * is written to guest RAM unless the whole image checks out.
 * Returns 0, or -errno with a one-line reason in `err`.
 */
int loader_load_image(struct guest_mem *mem, const uint8_t *buf, size_t len,
		      struct kernel_image *img, char *err, size_t errlen);
/*
 * loader_load_image on a file: an ELF goes from the file straight into guest RAM, segment by
 * segment (the headers checked first, as above); other images are read whole first.
 */
int loader_load_file(struct guest_mem *mem, const char *path, struct kernel_image *img, char *err,
		     size_t errlen);
/* Reads a whole file (capped at LOADER_MAX_FILE) into a malloc'd buffer. */
int loader_read_file(const char *path, uint8_t **buf, size_t *len, char *err, size_t errlen);

#endif
