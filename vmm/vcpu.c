/* vCPU threads: run KVM_RUN, hand port/MMIO exits to the buses, park in the pause gate, report fatal exits. */
#include "vmm/vcpu.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vmm/cpuid.h"
#include "vmm/kvm_util.h"

static const char *const exit_names[] = {
	[KVM_EXIT_UNKNOWN] = "KVM_EXIT_UNKNOWN",
	[KVM_EXIT_EXCEPTION] = "KVM_EXIT_EXCEPTION",
	[KVM_EXIT_IO] = "KVM_EXIT_IO",
	[KVM_EXIT_HYPERCALL] = "KVM_EXIT_HYPERCALL",
	[KVM_EXIT_DEBUG] = "KVM_EXIT_DEBUG",
	[KVM_EXIT_HLT] = "KVM_EXIT_HLT",
	[KVM_EXIT_MMIO] = "KVM_EXIT_MMIO",
	[KVM_EXIT_IRQ_WINDOW_OPEN] = "KVM_EXIT_IRQ_WINDOW_OPEN",
	[KVM_EXIT_SHUTDOWN] = "KVM_EXIT_SHUTDOWN",
	[KVM_EXIT_FAIL_ENTRY] = "KVM_EXIT_FAIL_ENTRY",
	[KVM_EXIT_INTR] = "KVM_EXIT_INTR",
	[KVM_EXIT_SET_TPR] = "KVM_EXIT_SET_TPR",
	[KVM_EXIT_TPR_ACCESS] = "KVM_EXIT_TPR_ACCESS",
	[KVM_EXIT_NMI] = "KVM_EXIT_NMI",
	[KVM_EXIT_INTERNAL_ERROR] = "KVM_EXIT_INTERNAL_ERROR",
	[KVM_EXIT_OSI] = "KVM_EXIT_OSI",
	[KVM_EXIT_SYSTEM_EVENT] = "KVM_EXIT_SYSTEM_EVENT",
};

const char *vcpu_exit_name(uint32_t reason)
{
	if (reason < sizeof(exit_names) / sizeof(exit_names[0]) && exit_names[reason])
		return exit_names[reason];
	return "KVM_EXIT_(unknown)";
}

int vcpu_create(struct vm *vm, struct vcpu *v, int id)
{
	memset(v, 0, sizeof(*v));
	v->vm = vm;
	v->id = id;
	v->fd = -1;
	int r = KVM_IOCTL(vm->log, vm->vm_fd, KVM_CREATE_VCPU, (void *)(long)id);
	if (r < 0)
		return r;
	v->fd = r;
	v->run_size = (size_t)vm->kvm_run_size;
	void *p = mmap(NULL, v->run_size, PROT_READ | PROT_WRITE, MAP_SHARED, v->fd, 0);
	if (p == MAP_FAILED) {
		r = -errno;
		log_err(vm->log, "mmap of vCPU %d run area failed: %s", id, strerror(-r));
		return r;
	}
	v->run = p;
	struct kvm_cpuid2 *c = cpuid_for_vcpu(vm->cpuid, id, vm->nr_vcpus);
	if (!c)
		return -ENOMEM;
	r = KVM_IOCTL(vm->log, v->fd, KVM_SET_CPUID2, c);
	free(c);
	return r;
}

void vcpu_destroy(struct vcpu *v)
{
	if (v->run)
		munmap(v->run, v->run_size);
	if (v->fd >= 0)
		close(v->fd);
	v->run = NULL;
	v->fd = -1;
}

static uint64_t vcpu_rip(struct vcpu *v)
{
	struct kvm_regs regs;
	if (kvm_ioctl_raw(v->fd, KVM_GET_REGS, &regs) < 0)
		return ~0ULL;
	return regs.rip;
}

static void handle_io(struct vcpu *v)
{
	struct kvm_run *run = v->run;
	uint8_t *data = (uint8_t *)run + run->io.data_offset;
	uint32_t size = run->io.size;
	/* data_offset and count come from KVM, but keep every access inside the run page. */
	if (run->io.data_offset >= v->run_size ||
	    (uint64_t)size * run->io.count > v->run_size - run->io.data_offset)
		return;
	for (uint32_t i = 0; i < run->io.count; i++, data += size) {
		int r;
		if (run->io.direction == KVM_EXIT_IO_OUT)
			r = bus_write(&v->vm->pio, run->io.port, data, size);
		else
			r = bus_read(&v->vm->pio, run->io.port, data, size);
		if (r == -ENOENT)
			log_debug(v->vm->log, "vcpu%d: unassigned port %s 0x%x size %u", v->id,
				  run->io.direction == KVM_EXIT_IO_OUT ? "write" : "read",
				  run->io.port, size);
	}
}

static void handle_mmio(struct vcpu *v)
{
	struct kvm_run *run = v->run;
	uint32_t len = run->mmio.len;
	if (len > sizeof(run->mmio.data))
		return;
	int r;
	if (run->mmio.is_write)
		r = bus_write(&v->vm->mmio, run->mmio.phys_addr, run->mmio.data, len);
	else
		r = bus_read(&v->vm->mmio, run->mmio.phys_addr, run->mmio.data, len);
	if (r == -ENOENT)
		log_debug(v->vm->log, "vcpu%d: unassigned MMIO %s 0x%llx len %u", v->id,
			  run->mmio.is_write ? "write" : "read",
			  (unsigned long long)run->mmio.phys_addr, len);
}

/* Returns false when the vCPU loop must end. */
static bool handle_exit(struct vcpu *v)
{
	struct vm *vm = v->vm;
	struct kvm_run *run = v->run;
	switch (run->exit_reason) {
	case KVM_EXIT_IO:
		handle_io(v);
		return true;
	case KVM_EXIT_MMIO:
		handle_mmio(v);
		return true;
	case KVM_EXIT_INTR:
		return true;
	case KVM_EXIT_HLT:
	case KVM_EXIT_SHUTDOWN:
		vm_request_stop(vm, 1, "vcpu%d stopped: %s at rip=0x%llx%s", v->id,
				vcpu_exit_name(run->exit_reason), (unsigned long long)vcpu_rip(v),
				run->exit_reason == KVM_EXIT_SHUTDOWN ? " (triple fault)" : "");
		return false;
	case KVM_EXIT_INTERNAL_ERROR:
		vm_request_stop(vm, 1, "vcpu%d stopped: KVM_EXIT_INTERNAL_ERROR suberror %u at rip=0x%llx",
				v->id, run->internal.suberror, (unsigned long long)vcpu_rip(v));
		return false;
	case KVM_EXIT_FAIL_ENTRY:
		vm_request_stop(vm, 1, "vcpu%d stopped: KVM_EXIT_FAIL_ENTRY reason 0x%llx at rip=0x%llx",
				v->id,
				(unsigned long long)run->fail_entry.hardware_entry_failure_reason,
				(unsigned long long)vcpu_rip(v));
		return false;
	case KVM_EXIT_SYSTEM_EVENT:
		if (run->system_event.type == KVM_SYSTEM_EVENT_SHUTDOWN ||
		    run->system_event.type == KVM_SYSTEM_EVENT_RESET) {
			/* The guest asked to power off or reboot: a clean stop. */
			vm_request_stop(vm, 0, "guest requested %s",
					run->system_event.type == KVM_SYSTEM_EVENT_RESET ? "reset"
											 : "shutdown");
		} else {
			vm_request_stop(vm, 1, "vcpu%d stopped: KVM_EXIT_SYSTEM_EVENT type %u",
					v->id, run->system_event.type);
		}
		return false;
	default:
		vm_request_stop(vm, 1, "vcpu%d stopped: unhandled %s (%u) at rip=0x%llx", v->id,
				vcpu_exit_name(run->exit_reason), run->exit_reason,
				(unsigned long long)vcpu_rip(v));
		return false;
	}
}

/*
 * Entered only after KVM_RUN returned -EINTR, so any port/MMIO access that was
 * in flight has been completed by KVM: the vCPU is at an instruction boundary.
 * Returns false when the VM is stopping.
 */
static bool pause_gate(struct vcpu *v)
{
	struct vm *vm = v->vm;
	pthread_mutex_lock(&vm->lock);
	while (vm->pause_requested && !vm->stop_requested) {
		if (!v->parked) {
			v->parked = true;
			vm->nr_parked++;
			pthread_cond_broadcast(&vm->cond);
		}
		pthread_cond_wait(&vm->cond, &vm->lock);
	}
	if (v->parked) {
		v->parked = false;
		vm->nr_parked--;
	}
	bool go_on = !vm->stop_requested;
	/* Cleared under the lock: a pause requested after this point sets it again. */
	if (go_on)
		__atomic_store_n(&v->run->immediate_exit, 0, __ATOMIC_SEQ_CST);
	pthread_mutex_unlock(&vm->lock);
	return go_on;
}

static void *vcpu_thread(void *arg)
{
	struct vcpu *v = arg;
	struct vm *vm = v->vm;
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, vm->kick_signal);
	pthread_sigmask(SIG_UNBLOCK, &set, NULL);
	char name[16];
	snprintf(name, sizeof(name), "cove-vcpu%d", v->id);
	pthread_setname_np(pthread_self(), name);
	/* The sandbox's per-thread set-up (its seccomp filter) before the first guest instruction. */
	int hr = vm_thread_enter(vm, VM_THREAD_VCPU);
	if (hr)
		vm_request_stop(vm, 1, "vcpu%d: thread set-up failed: %s", v->id, strerror(-hr));

	pthread_mutex_lock(&vm->lock);
	v->self = pthread_self();
	v->running = true;
	bool stop = vm->stop_requested;
	pthread_mutex_unlock(&vm->lock);

	for (; !stop;) {
		int r = ioctl(v->fd, KVM_RUN, NULL);
		if (r < 0) {
			if (errno == EINTR || errno == EAGAIN) {
				if (!pause_gate(v))
					break;
				continue;
			}
			vm_request_stop(vm, 1, "vcpu%d: KVM_RUN failed: %s", v->id, strerror(errno));
			break;
		}
		if (!handle_exit(v))
			break;
	}
	pthread_mutex_lock(&vm->lock);
	v->running = false;
	v->exited = true;
	pthread_cond_broadcast(&vm->cond);
	pthread_mutex_unlock(&vm->lock);
	return NULL;
}

int vcpu_start(struct vcpu *v)
{
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	/* The run loop needs little stack; keep the VMM's footprint small. */
	pthread_attr_setstacksize(&attr, 256 * 1024);
	int r = pthread_create(&v->thread, &attr, vcpu_thread, v);
	pthread_attr_destroy(&attr);
	if (r)
		return -r;
	v->thread_started = true;
	return 0;
}
