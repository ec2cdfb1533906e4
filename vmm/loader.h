/* Kernel image loading: ELF64 executables (test guests) and flat binaries, checked against guest RAM. */
#ifndef COVE_LOADER_H
#define COVE_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "guest_mem.h"

#define LOADER_MAX_FILE (512ULL << 20)

/*
 * Pure over a buffer: validates an ELF64 x86-64 executable and copies its
 * PT_LOAD segments to their physical addresses (>= 1 MiB, inside RAM).  A
 * buffer that is not ELF is loaded flat at 1 MiB and entered there.
 * Returns 0 and the entry point, or -errno with a one-line reason in `err`.
 */
int loader_load_image(struct guest_mem *mem, const uint8_t *buf, size_t len, uint64_t *entry,
		      char *err, size_t errlen);
/* Reads a whole file (capped at LOADER_MAX_FILE) into a malloc'd buffer. */
int loader_read_file(const char *path, uint8_t **buf, size_t *len, char *err, size_t errlen);

#endif
