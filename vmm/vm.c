/* VM lifecycle: create the KVM VM (irqchip, PIT, memory slots, vCPUs), pause/resume, stop. */
#include "vmm/vm.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vmm/cpuid.h"
#include "vmm/dirty_log.h"
#include "vmm/kvm_util.h"
#include "vmm/vcpu.h"

/* Below the 4 GiB boundary, out of RAM's way: the TSS and identity map Intel's VMX needs. */
#define KVM_TSS_ADDR 0xfffbd000ULL
#define KVM_IDENTITY_MAP_ADDR 0xfffbc000ULL

int vm_thread_enter(struct vm *vm, enum vm_thread_kind kind)
{
	return vm->thread_hook ? vm->thread_hook(vm->thread_hook_opaque, kind) : 0;
}

const char *vm_state_name(enum vm_state s)
{
	switch (s) {
	case VM_NOT_STARTED:
		return "NotStarted";
	case VM_RUNNING:
		return "Running";
	case VM_PAUSED:
		return "Paused";
	case VM_STOPPED:
		return "Stopped";
	}
	return "Unknown";
}

static void kick_handler(int sig)
{
	(void)sig; /* Only here so the signal interrupts KVM_RUN with EINTR. */
}

static int install_kick_signal(int sig)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = kick_handler;
	sigemptyset(&sa.sa_mask);
	/* No SA_RESTART: KVM_RUN must return -EINTR to the vCPU loop. */
	if (sigaction(sig, &sa, NULL) < 0)
		return -errno;
	return 0;
}

struct required_cap {
	int cap;
	const char *name;
};

static const struct required_cap required_caps[] = {
	{ KVM_CAP_USER_MEMORY, "KVM_CAP_USER_MEMORY" },
	{ KVM_CAP_IRQCHIP, "KVM_CAP_IRQCHIP" },
	{ KVM_CAP_PIT2, "KVM_CAP_PIT2" },
	{ KVM_CAP_IRQFD, "KVM_CAP_IRQFD" },
	{ KVM_CAP_IOEVENTFD, "KVM_CAP_IOEVENTFD" },
	{ KVM_CAP_IMMEDIATE_EXIT, "KVM_CAP_IMMEDIATE_EXIT" },
	{ KVM_CAP_EXT_CPUID, "KVM_CAP_EXT_CPUID" },
};

static int check_caps(struct vm *vm)
{
	for (size_t i = 0; i < sizeof(required_caps) / sizeof(required_caps[0]); i++) {
		int r = kvm_ioctl_raw(vm->kvm_fd, KVM_CHECK_EXTENSION,
				      (void *)(long)required_caps[i].cap);
		if (r <= 0) {
			log_err(vm->log, "/dev/kvm lacks %s, which cove needs", required_caps[i].name);
			return -ENOTSUP;
		}
	}
	return 0;
}

static int setup_memory(struct vm *vm, const struct vm_config *cfg)
{
	uint64_t size = cfg->mem_size;
	int r = guest_mem_create_from(&vm->mem, size, cfg->mem_from_file ? cfg->mem_file_fd : -1,
				      cfg->mem_file_off);
	if (r) {
		log_err(vm->log, "cannot create %llu bytes of guest memory: %s",
			(unsigned long long)size, strerror(-r));
		return r;
	}
	r = dirty_log_enable(vm);
	if (r)
		return r;
	for (uint32_t i = 0; i < vm->mem.nr_slots; i++) {
		const struct mem_slot *s = &vm->mem.slots[i];
		struct kvm_userspace_memory_region region = {
			.slot = s->id,
			.flags = vm->track_dirty ? KVM_MEM_LOG_DIRTY_PAGES : 0,
			.guest_phys_addr = s->gpa,
			.memory_size = s->size,
			.userspace_addr = (uint64_t)(uintptr_t)(vm->mem.host + s->file_off),
		};
		r = KVM_IOCTL(vm->log, vm->vm_fd, KVM_SET_USER_MEMORY_REGION, &region);
		if (r)
			return r;
	}
	uint64_t pages = size >> PAGE_SHIFT;
	/* mmap rather than calloc: untouched anonymous pages cost no RSS, whatever the RAM size. */
	vm->vmm_dirty_bytes = (size_t)((pages + 63) / 64 * sizeof(uint64_t));
	void *bm = mmap(NULL, vm->vmm_dirty_bytes, PROT_READ | PROT_WRITE,
			MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (bm == MAP_FAILED)
		return -ENOMEM;
	vm->vmm_dirty = bm;
	bm = mmap(NULL, vm->vmm_dirty_bytes, PROT_READ | PROT_WRITE,
		  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (bm == MAP_FAILED)
		return -ENOMEM;
	vm->discarded = bm;
	return 0;
}

int vm_create(struct vm *vm, const struct vm_config *cfg, struct logger *log)
{
	int r;
	memset(vm, 0, sizeof(*vm));
	vm->log = log;
	vm->kvm_fd = vm->vm_fd = vm->stop_efd = -1;
	vm->loop.epfd = -1;
	vm->mem.fd = -1;
	vm->kick_signal = SIGRTMIN;
	pthread_mutex_init(&vm->lock, NULL);
	pthread_cond_init(&vm->cond, NULL);
	pthread_mutex_init(&vm->dirty_lock, NULL);
	bus_init(&vm->pio, "pio");
	bus_init(&vm->mmio, "mmio");
	vm_host_init(vm);

	if (cfg->nr_vcpus < 1 || cfg->nr_vcpus > VM_MAX_VCPUS) {
		log_err(log, "vcpus must be 1..%d", VM_MAX_VCPUS);
		return -EINVAL;
	}

	vm->kvm_fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
	if (vm->kvm_fd < 0) {
		r = -errno;
		log_err(log, "cannot open /dev/kvm: %s", strerror(-r));
		return r;
	}
	r = kvm_ioctl_raw(vm->kvm_fd, KVM_GET_API_VERSION, NULL);
	if (r != KVM_API_VERSION) {
		log_err(log, "KVM API version %d, cove needs %d", r, KVM_API_VERSION);
		r = -ENOTSUP;
		goto err;
	}
	r = kvm_ioctl_raw(vm->kvm_fd, KVM_GET_VCPU_MMAP_SIZE, NULL);
	if (r <= 0) {
		log_err(log, "KVM_GET_VCPU_MMAP_SIZE failed");
		r = r < 0 ? r : -EINVAL;
		goto err;
	}
	vm->kvm_run_size = r;

	r = KVM_IOCTL(log, vm->kvm_fd, KVM_CREATE_VM, NULL);
	if (r < 0)
		goto err;
	vm->vm_fd = r;
	r = check_caps(vm);
	if (r)
		goto err;

	r = KVM_IOCTL(log, vm->vm_fd, KVM_SET_TSS_ADDR, (void *)(uintptr_t)KVM_TSS_ADDR);
	if (r)
		goto err;
	uint64_t idmap = KVM_IDENTITY_MAP_ADDR;
	r = KVM_IOCTL(log, vm->vm_fd, KVM_SET_IDENTITY_MAP_ADDR, &idmap);
	if (r)
		goto err;
	/*
	 * Full in-kernel irqchip (PIC + IOAPIC + LAPIC) rather than a split one:
	 * Linux guests route virtio-mmio interrupts through the IOAPIC and irqfd
	 * can then inject without a VMM round trip; a split irqchip would make us
	 * emulate the IOAPIC in user space for no gain.  Firecracker does the same.
	 */
	r = KVM_IOCTL(log, vm->vm_fd, KVM_CREATE_IRQCHIP, NULL);
	if (r)
		goto err;
	struct kvm_pit_config pit = { .flags = KVM_PIT_SPEAKER_DUMMY };
	r = KVM_IOCTL(log, vm->vm_fd, KVM_CREATE_PIT2, &pit);
	if (r)
		goto err;

	vm->track_dirty = cfg->track_dirty;
	r = setup_memory(vm, cfg);
	if (r)
		goto err;

	r = cpuid_get_supported(vm->kvm_fd, &vm->cpuid);
	if (r) {
		log_err(log, "KVM_GET_SUPPORTED_CPUID failed: %s", strerror(-r));
		goto err;
	}
	if (cfg->cpu_template[0]) {
		r = cpu_template_apply(cfg->cpu_template, vm->cpuid);
		if (r) {
			log_err(log, "unknown CPU template %s (cove has: %s)", cfg->cpu_template,
				cpu_template_names());
			goto err;
		}
		log_info(log, "CPU template %s: the guest sees only its baseline",
			 cfg->cpu_template);
	}
	r = evloop_init(&vm->loop);
	if (r)
		goto err;
	vm->stop_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (vm->stop_efd < 0) {
		r = -errno;
		goto err;
	}
	r = install_kick_signal(vm->kick_signal);
	if (r)
		goto err;

	vm->nr_vcpus = cfg->nr_vcpus;
	for (int i = 0; i < vm->nr_vcpus; i++) {
		vm->vcpus[i].fd = -1;
	}
	for (int i = 0; i < vm->nr_vcpus; i++) {
		r = vcpu_create(vm, &vm->vcpus[i], i);
		if (r)
			goto err;
	}
	vm->state = VM_NOT_STARTED;
	return 0;
err:
	vm_destroy(vm);
	return r;
}

void vm_destroy(struct vm *vm)
{
	for (int i = 0; i < vm->nr_vcpus; i++)
		vcpu_destroy(&vm->vcpus[i]);
	vm->nr_vcpus = 0;
	free(vm->cpuid);
	vm->cpuid = NULL;
	if (vm->vmm_dirty)
		munmap(vm->vmm_dirty, vm->vmm_dirty_bytes);
	vm->vmm_dirty = NULL;
	if (vm->discarded)
		munmap(vm->discarded, vm->vmm_dirty_bytes);
	vm->discarded = NULL;
	if (vm->stop_efd >= 0)
		close(vm->stop_efd);
	vm->stop_efd = -1;
	evloop_destroy(&vm->loop);
	guest_mem_destroy(&vm->mem);
	if (vm->vm_fd >= 0)
		close(vm->vm_fd);
	if (vm->kvm_fd >= 0)
		close(vm->kvm_fd);
	vm->vm_fd = vm->kvm_fd = -1;
}

int vm_start(struct vm *vm)
{
	pthread_mutex_lock(&vm->lock);
	vm->state = VM_RUNNING;
	pthread_mutex_unlock(&vm->lock);
	for (int i = 0; i < vm->nr_vcpus; i++) {
		int r = vcpu_start(&vm->vcpus[i]);
		if (r) {
			vm_request_stop(vm, 1, "cannot start vCPU %d thread: %s", i, strerror(-r));
			return r;
		}
	}
	return 0;
}

/*
 * Makes every vCPU leave KVM_RUN soon: immediate_exit covers the window before
 * it enters, the signal a thread already inside.  Called with vm->lock held; a
 * thread not yet marked running checks the stop/pause flags under that lock
 * before its first KVM_RUN, so none is missed.
 */
static void kick_all(struct vm *vm)
{
	for (int i = 0; i < vm->nr_vcpus; i++) {
		struct vcpu *v = &vm->vcpus[i];
		__atomic_store_n(&v->run->immediate_exit, 1, __ATOMIC_SEQ_CST);
		if (v->running)
			pthread_kill(v->self, vm->kick_signal);
	}
}

static int live_vcpus(struct vm *vm)
{
	int n = 0;
	for (int i = 0; i < vm->nr_vcpus; i++)
		n += vm->vcpus[i].thread_started && !vm->vcpus[i].exited;
	return n;
}

int vm_pause(struct vm *vm)
{
	pthread_mutex_lock(&vm->lock);
	if (vm->state == VM_PAUSED) {
		pthread_mutex_unlock(&vm->lock);
		return 0;
	}
	if (vm->state != VM_RUNNING) {
		pthread_mutex_unlock(&vm->lock);
		return -EBUSY;
	}
	vm->pause_requested = true;
	kick_all(vm);
	while (vm->nr_parked < live_vcpus(vm) && !vm->stop_requested)
		pthread_cond_wait(&vm->cond, &vm->lock);
	int r = 0;
	if (vm->stop_requested) {
		vm->pause_requested = false;
		r = -EBUSY;
	} else {
		vm->state = VM_PAUSED;
	}
	pthread_mutex_unlock(&vm->lock);
	return r;
}

int vm_resume(struct vm *vm)
{
	pthread_mutex_lock(&vm->lock);
	if (vm->state == VM_RUNNING) {
		pthread_mutex_unlock(&vm->lock);
		return 0;
	}
	if (vm->state != VM_PAUSED) {
		pthread_mutex_unlock(&vm->lock);
		return -EBUSY;
	}
	vm->pause_requested = false;
	vm->state = VM_RUNNING;
	pthread_cond_broadcast(&vm->cond);
	pthread_mutex_unlock(&vm->lock);
	return 0;
}

void vm_request_stop(struct vm *vm, int status, const char *fmt, ...)
{
	pthread_mutex_lock(&vm->lock);
	if (!vm->stop_requested) {
		vm->stop_requested = true;
		vm->exit.status = status;
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(vm->exit.reason, sizeof(vm->exit.reason), fmt, ap);
		va_end(ap);
		if (vm->guest_panic[0] && status == 0) {
			vm->exit.status = 1;
			snprintf(vm->exit.reason, sizeof(vm->exit.reason), "guest kernel panicked: %.100s",
				 vm->guest_panic);
		}
		kick_all(vm);
		pthread_cond_broadcast(&vm->cond);
		uint64_t one = 1;
		if (write(vm->stop_efd, &one, sizeof(one)) < 0) {
			/* The eventfd counter cannot overflow from single increments; nothing to do. */
		}
	}
	pthread_mutex_unlock(&vm->lock);
}

void vm_note_guest_panic(struct vm *vm, const char *line)
{
	pthread_mutex_lock(&vm->lock);
	if (!vm->guest_panic[0])
		snprintf(vm->guest_panic, sizeof(vm->guest_panic), "%s", line);
	pthread_mutex_unlock(&vm->lock);
}

enum vm_state vm_get_state(struct vm *vm)
{
	pthread_mutex_lock(&vm->lock);
	enum vm_state s = vm->state;
	pthread_mutex_unlock(&vm->lock);
	return s;
}

void vm_join(struct vm *vm)
{
	for (int i = 0; i < vm->nr_vcpus; i++) {
		if (vm->vcpus[i].thread_started) {
			pthread_join(vm->vcpus[i].thread, NULL);
			vm->vcpus[i].thread_started = false;
		}
	}
	pthread_mutex_lock(&vm->lock);
	vm->state = VM_STOPPED;
	pthread_mutex_unlock(&vm->lock);
}

void vm_mark_dirty(struct vm *vm, uint64_t gpa, uint64_t len)
{
	if (len == 0)
		return;
	pthread_mutex_lock(&vm->dirty_lock);
	for (uint64_t a = gpa & ~(PAGE_SIZE - 1); a < gpa + len; a += PAGE_SIZE) {
		int64_t idx = guest_mem_page_index(&vm->mem, a);
		if (idx >= 0)
			vm->vmm_dirty[idx / 64] |= 1ULL << (idx % 64);
	}
	pthread_mutex_unlock(&vm->dirty_lock);
}

int vm_set_irq_line(struct vm *vm, uint32_t irq, int level)
{
	struct kvm_irq_level l = { .irq = irq, .level = (uint32_t)level };
	return kvm_ioctl_raw(vm->vm_fd, KVM_IRQ_LINE, &l);
}
