/* Puts a kernel (and initrd, cmdline) into a VM and sets the boot vCPU's entry state. */
#ifndef COVE_BOOT_H
#define COVE_BOOT_H

struct vm;

struct boot_spec {
	const char *kernel;
	const char *initrd;  /* may be NULL */
	const char *cmdline; /* never NULL */
};

/* Returns 0 or -errno after logging one line that says what was wrong. */
int boot_load(struct vm *vm, const struct boot_spec *spec);

#endif
