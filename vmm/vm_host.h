/* struct vm_host: the few machine services a device may use, so devices never see struct vm. */
#ifndef COVE_VM_HOST_H
#define COVE_VM_HOST_H

#include <stdbool.h>
#include <stdint.h>

#include "common/log.h"
#include "vmm/bus.h"
#include "vmm/evloop.h"
#include "vmm/guest_mem.h"

/* What the machine does for a device; every entry is set (devices never check). */
struct vm_host_ops {
	/* Drives an interrupt line of the interrupt controller. 0 or -errno. */
	int (*set_irq)(void *ctx, uint32_t irq, int level);
	/* Guest pages the VMM wrote (device DMA), for snapshots. */
	void (*mark_dirty)(void *ctx, uint64_t gpa, uint64_t len);
	/* The machine must stop with `status` (guest reset request). */
	void (*request_stop)(void *ctx, int status, const char *reason);
	/* The guest kernel reported a panic (its console line). */
	void (*note_panic)(void *ctx, const char *line);
	/* `fd` raises line `gsi` when written (KVM irqfd); assign false undoes it. 0 or -errno. */
	int (*irqfd)(void *ctx, int fd, uint32_t gsi, bool assign);
	/* A 4-byte guest write of `datamatch` at `addr` signals `fd` (KVM ioeventfd). */
	int (*ioeventfd)(void *ctx, int fd, uint64_t addr, uint32_t datamatch, bool assign);
	/*
	 * Gives page-aligned guest RAM [gpa, gpa+len) back to the host (the guest reads zeros
	 * there next) and records it for the next snapshot. 0 or -errno.
	 */
	int (*discard)(void *ctx, uint64_t gpa, uint64_t len);
};

/*
 * vm_create fills one for the real machine (vm->host); unit tests fill one with fakes (real
 * buses and event loop, recording callbacks).
 */
struct vm_host {
	struct logger *log;
	const struct guest_mem *mem;
	struct bus *pio, *mmio;
	struct evloop *loop; /* device fds are watched here */
	const struct vm_host_ops *ops;
	void *ctx; /* passed to every op */

	/* Set by the board: the device that takes a Ctrl-Alt-Del request (the API's action). */
	void *reset_dev;
	int (*send_ctrl_alt_del)(void *dev);
};

#endif
