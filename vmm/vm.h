/* struct vm: everything one microVM owns (KVM fds, memory, vCPUs, buses, event loop), passed explicitly. */
#ifndef COVE_VM_H
#define COVE_VM_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <linux/kvm.h>

#include "vmm/bus.h"
#include "vmm/cpu_template.h"
#include "vmm/evloop.h"
#include "vmm/guest_mem.h"
#include "vmm/vm_host.h"
#include "common/log.h"

#define VM_MAX_VCPUS 64

enum vm_state {
	VM_NOT_STARTED = 0,
	VM_RUNNING,
	VM_PAUSED,
	VM_STOPPED,
};

const char *vm_state_name(enum vm_state s);

struct vm;

struct vcpu {
	struct vm *vm;
	int id;
	int fd;
	struct kvm_run *run;
	size_t run_size;
	pthread_t thread;
	bool thread_started;
	pthread_t self;	 /* set by the vCPU thread itself, under vm->lock */
	bool running;	 /* protected by vm->lock: the thread may be inside KVM_RUN */
	bool parked; /* protected by vm->lock: thread is waiting in the pause gate */
	bool exited; /* protected by vm->lock: thread left its run loop */
};

/* Why the VM stopped: the first stop request wins. */
struct vm_exit_info {
	int status;	   /* process exit status cove returns */
	char reason[160];  /* one line, printed when the VM ends */
};

/* The threads a VM starts, for the sandbox's per-thread set-up (seccomp filters). */
enum vm_thread_kind {
	VM_THREAD_VCPU, /* vmm/vcpu.c: before its first KVM_RUN */
	VM_THREAD_UFFD, /* snapshot/lazy_mem.c: before it serves the first fault */
};
/* Runs on the new thread itself; non-zero (-errno): the thread stops the VM and ends. */
typedef int (*vm_thread_hook)(void *opaque, enum vm_thread_kind kind);
struct vm;
/* Called by a thread of kind at its start: the VM's thread_hook, or 0 without one. */
int vm_thread_enter(struct vm *vm, enum vm_thread_kind kind);

struct vm {
	int kvm_fd;
	int vm_fd;
	int kvm_run_size;
	struct guest_mem mem;
	struct bus pio;
	struct bus mmio;
	struct evloop loop;
	struct logger *log;

	int nr_vcpus;
	struct vcpu vcpus[VM_MAX_VCPUS];
	struct kvm_cpuid2 *cpuid;
	int kick_signal; /* realtime signal used to kick vCPU threads out of KVM_RUN */

	/* Lifecycle; protected by lock. */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	enum vm_state state;
	bool pause_requested;
	int nr_parked;
	bool stop_requested;
	struct vm_exit_info exit;
	char guest_panic[128]; /* set when the guest kernel reported a panic */
	int stop_efd; /* eventfd: wakes the event loop when the VM must stop */

	/* Dirty pages written by the VMM itself (KVM does not see these); one bit per RAM page. */
	uint64_t *vmm_dirty;
	size_t vmm_dirty_bytes;
	/*
	 * Pages given back to the host (balloon) since the last snapshot, same size and lock as
	 * vmm_dirty: a snapshot checks these for holes instead of reading them (reading a memfd
	 * hole through the mapping would allocate the page again). NULL: none tracked.
	 */
	uint64_t *discarded;
	bool dirty_manual; /* KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 enabled: GET then CLEAR */
	bool track_dirty;  /* slots carry KVM_MEM_LOG_DIRTY_PAGES */
	pthread_mutex_t dirty_lock;

	/* What devices see of this machine (vm_create fills it; the board sets reset_dev). */
	struct vm_host host;

	/* Set after vm_create by the sandbox; NULL: threads start with no extra set-up. */
	vm_thread_hook thread_hook;
	void *thread_hook_opaque;
};

struct vm_config {
	uint64_t mem_size;
	int nr_vcpus;
	/*
	 * Log guest writes in KVM from boot (KVM_MEM_LOG_DIRTY_PAGES).  Off by
	 * default, as Firecracker's track_dirty_pages: logging makes KVM map guest
	 * RAM with 4 KiB pages and costs guest speed.
	 */
	bool track_dirty;
	/* Restore: RAM maps snapshot layer file mem_file_fd privately from mem_file_off. */
	bool mem_from_file;
	int mem_file_fd;
	uint64_t mem_file_off;
	/*
	 * A CPU template (cpu_template.h) narrowing the CPUID every vCPU gets; empty: all that
	 * KVM offers. A chain records the name, so every restore applies it again.
	 */
	char cpu_template[CPU_TEMPLATE_NAME_MAX];
};

int vm_create(struct vm *vm, const struct vm_config *cfg, struct logger *log);
void vm_destroy(struct vm *vm);

/* Starts one thread per vCPU. */
int vm_start(struct vm *vm);
/* Stops every vCPU at an instruction boundary; returns once all are parked. Idempotent. */
int vm_pause(struct vm *vm);
int vm_resume(struct vm *vm);
/*
 * Asks the VM to stop with `status` and a one-line reason.  Safe from any
 * thread; only the first request is kept.
 */
void vm_request_stop(struct vm *vm, int status, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
enum vm_state vm_get_state(struct vm *vm);
/* Records that the guest kernel panicked: its next stop is then reported as a failure. */
void vm_note_guest_panic(struct vm *vm, const char *line);
/* Joins the vCPU threads after a stop. */
void vm_join(struct vm *vm);

/* Drives an interrupt line of the in-kernel PIC/IOAPIC. Returns 0 or -errno. */
int vm_set_irq_line(struct vm *vm, uint32_t irq, int level);

/* Marks guest pages the VMM wrote (device DMA), for snapshots. */
void vm_mark_dirty(struct vm *vm, uint64_t gpa, uint64_t len);

/* Fills vm->host with this VM's buses, loop, memory and KVM-backed callbacks (vm_create does). */
void vm_host_init(struct vm *vm);

#endif
