/* Boot set-up: load kernel and initrd into RAM, write boot tables, set the boot vCPU's registers. */
#include "boot.h"

#include <asm/bootparam.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "loader.h"
#include "vm.h"
#include "x86_boot.h"

/* Linux reads an initrd only below this address unless told otherwise. */
#define INITRD_ADDR_MAX 0x37ffffffULL

static int load_initrd(struct vm *vm, const char *path, uint64_t kernel_end)
{
	char err[256];
	uint8_t *buf;
	size_t len;
	int r = loader_read_file(path, &buf, &len, err, sizeof(err));
	if (r) {
		log_err(vm->log, "initrd: %s", err);
		return r;
	}
	uint64_t top = vm->mem.slots[0].size;
	if (top > INITRD_ADDR_MAX + 1)
		top = INITRD_ADDR_MAX + 1;
	/* Highest page-aligned spot under `top`, as bootloaders do, clear of the kernel. */
	uint64_t addr = len < top ? (top - len) & ~(PAGE_SIZE - 1) : 0;
	if (len == 0 || addr < kernel_end || !guest_mem_ptr(&vm->mem, addr, len)) {
		log_err(vm->log, "initrd %s (%zu bytes) does not fit in guest RAM below 0x%llx", path,
			len, (unsigned long long)top);
		free(buf);
		return -EFBIG;
	}
	memcpy(guest_mem_ptr(&vm->mem, addr, len), buf, len);
	free(buf);
	struct boot_params *bp = guest_mem_ptr(&vm->mem, BOOT_ZERO_PAGE_ADDR, sizeof(*bp));
	bp->hdr.ramdisk_image = (uint32_t)addr;
	bp->hdr.ramdisk_size = (uint32_t)len;
	return 0;
}

int boot_load(struct vm *vm, const struct boot_spec *spec)
{
	char err[256];
	uint8_t *buf;
	size_t len;
	uint64_t entry;
	int r = loader_read_file(spec->kernel, &buf, &len, err, sizeof(err));
	if (r) {
		log_err(vm->log, "kernel: %s", err);
		return r;
	}
	r = loader_load_image(&vm->mem, buf, len, &entry, err, sizeof(err));
	free(buf);
	if (r) {
		log_err(vm->log, "kernel %s: %s", spec->kernel, err);
		return r;
	}
	r = x86_boot_write_tables(&vm->mem);
	if (!r)
		r = x86_boot_write_zero_page(&vm->mem, spec->cmdline);
	if (r) {
		log_err(vm->log, "cannot write boot tables: %s", strerror(-r));
		return r;
	}
	if (spec->initrd) {
		r = load_initrd(vm, spec->initrd, HIMEM_START + len);
		if (r)
			return r;
	}
	/* Only the boot vCPU starts here; the others wait for INIT/SIPI in the in-kernel LAPIC. */
	return x86_boot_setup_vcpu(&vm->vcpus[0], entry);
}
