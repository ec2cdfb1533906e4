/* The real machine's struct vm_host: device services backed by KVM and struct vm. */
#include "vmm/vm_host.h"

#include <linux/kvm.h>

#include "vmm/dirty_log.h"
#include "vmm/kvm_util.h"
#include "vmm/vm.h"

static int host_set_irq(void *ctx, uint32_t irq, int level)
{
	return vm_set_irq_line(ctx, irq, level);
}

static void host_mark_dirty(void *ctx, uint64_t gpa, uint64_t len)
{
	vm_mark_dirty(ctx, gpa, len);
}

static void host_request_stop(void *ctx, int status, const char *reason)
{
	vm_request_stop(ctx, status, "%s", reason);
}

static void host_note_panic(void *ctx, const char *line)
{
	vm_note_guest_panic(ctx, line);
}

/* Assigning fails loudly (naming the ioctl); undoing is best effort on teardown. */
static int host_irqfd(void *ctx, int fd, uint32_t gsi, bool assign)
{
	struct vm *vm = ctx;
	struct kvm_irqfd f = {
	    .fd = (uint32_t)fd,
	    .gsi = gsi,
	    .flags = assign ? 0 : KVM_IRQFD_FLAG_DEASSIGN,
	};
	return assign ? KVM_IOCTL(vm->log, vm->vm_fd, KVM_IRQFD, &f)
		      : kvm_ioctl_raw(vm->vm_fd, KVM_IRQFD, &f);
}

static int host_ioeventfd(void *ctx, int fd, uint64_t addr, uint32_t datamatch, bool assign)
{
	struct vm *vm = ctx;
	struct kvm_ioeventfd io = {
	    .datamatch = datamatch,
	    .addr = addr,
	    .len = 4,
	    .fd = fd,
	    .flags = KVM_IOEVENTFD_FLAG_DATAMATCH | (assign ? 0 : KVM_IOEVENTFD_FLAG_DEASSIGN),
	};
	return assign ? KVM_IOCTL(vm->log, vm->vm_fd, KVM_IOEVENTFD, &io)
		      : kvm_ioctl_raw(vm->vm_fd, KVM_IOEVENTFD, &io);
}

static int host_discard(void *ctx, uint64_t gpa, uint64_t len)
{
	return dirty_log_discard(ctx, gpa, len);
}

/* In struct order; every entry has its own signature, so a slip does not compile. */
static const struct vm_host_ops kvm_host_ops = {host_set_irq,	 host_mark_dirty, host_request_stop,
						host_note_panic, host_irqfd,	  host_ioeventfd,
						host_discard};

void vm_host_init(struct vm *vm)
{
	vm->host = (struct vm_host){
	    .log = vm->log,
	    .mem = &vm->mem,
	    .pio = &vm->pio,
	    .mmio = &vm->mmio,
	    .loop = &vm->loop,
	    .ops = &kvm_host_ops,
	    .ctx = vm,
	};
}
