/* Boot set-up: load kernel and initrd into RAM, write boot tables, set the boot vCPU's registers. */
#include "vmm/boot.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/file_io.h"
#include "vmm/loader.h"
#include "vmm/mptable.h"
#include "vmm/vm.h"
#include "vmm/x86_boot.h"

/* Linux reads an initrd only below this address unless told otherwise. */
#define INITRD_ADDR_MAX 0x37ffffffULL

static int load_initrd(struct vm *vm, const char *path, uint64_t kernel_end, uint64_t *addr_out,
		       uint64_t *size_out)
{
	/* Read straight into guest RAM: one copy, no whole-file buffer. */
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		log_err(vm->log, "initrd: cannot open %s: %s", path, strerror(e));
		return -e;
	}
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > LOADER_MAX_FILE) {
		log_err(vm->log, "initrd: %s is not a regular file of at most %llu MiB", path,
			LOADER_MAX_FILE >> 20);
		close(fd);
		return -EINVAL;
	}
	size_t len = (size_t)st.st_size;
	uint64_t top = vm->mem.slots[0].size;
	if (top > INITRD_ADDR_MAX + 1)
		top = INITRD_ADDR_MAX + 1;
	/* Highest page-aligned spot under `top`, as bootloaders do, clear of the kernel. */
	uint64_t addr = len < top ? (top - len) & ~(PAGE_SIZE - 1) : 0;
	void *dst = guest_mem_ptr(&vm->mem, addr, len);
	if (len == 0 || addr < kernel_end || !dst) {
		log_err(vm->log, "initrd %s (%zu bytes) does not fit in guest RAM between 0x%llx and 0x%llx",
			path, len, (unsigned long long)kernel_end, (unsigned long long)top);
		close(fd);
		return len == 0 ? -EINVAL : -EFBIG;
	}
	int r = pread_full(fd, dst, len, 0);
	close(fd);
	if (r) {
		log_err(vm->log, "initrd: short read of %s", path);
		return r;
	}
	*addr_out = addr;
	*size_out = len;
	return 0;
}

int boot_load(struct vm *vm, const struct boot_spec *spec)
{
	char err[256];
	struct kernel_image img;
	int r = loader_load_file(&vm->mem, spec->kernel, &img, err, sizeof(err));
	if (r) {
		log_err(vm->log, "kernel %s: %s", spec->kernel, err);
		return r;
	}
	/* An ELF with a PVH note (a Linux vmlinux) is entered through PVH, as Firecracker does. */
	enum boot_mode mode = img.pvh_entry ? BOOT_PVH : BOOT_LONG_MODE;
	r = x86_boot_write_tables(&vm->mem, mode == BOOT_PVH);
	if (!r)
		r = x86_boot_write_zero_page(&vm->mem, spec->cmdline, &img);
	if (!r)
		r = mptable_write(&vm->mem, vm->nr_vcpus);
	if (r) {
		log_err(vm->log, "cannot write boot tables: %s", strerror(-r));
		return r;
	}
	uint64_t initrd_addr = 0, initrd_size = 0;
	if (spec->initrd) {
		r = load_initrd(vm, spec->initrd, img.load_end, &initrd_addr, &initrd_size);
		if (r)
			return r;
		r = x86_boot_set_initrd(&vm->mem, initrd_addr, initrd_size);
		if (r)
			return r;
	}
	if (mode == BOOT_PVH) {
		r = x86_boot_write_pvh_info(&vm->mem, spec->cmdline, initrd_addr, initrd_size);
		if (r) {
			log_err(vm->log, "cannot write PVH start info: %s", strerror(-r));
			return r;
		}
	}
	log_debug(vm->log, "kernel %s: %s entry 0x%llx", spec->kernel,
		  mode == BOOT_PVH ? "PVH" : "64-bit",
		  (unsigned long long)(mode == BOOT_PVH ? img.pvh_entry : img.entry));
	for (int i = 0; i < vm->nr_vcpus; i++) {
		r = x86_boot_setup_cpu_common(&vm->vcpus[i]);
		if (r)
			return r;
	}
	/* Only the boot vCPU starts here; the others wait for INIT/SIPI in the in-kernel LAPIC. */
	return x86_boot_setup_vcpu(&vm->vcpus[0], mode == BOOT_PVH ? img.pvh_entry : img.entry,
				   mode);
}
