/* `cove doctor`: what this host's /dev/kvm offers, and whether guest kernels run natively on it. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "cli/commands.h"
#include "common/clock.h"
#include "vmm/kvm_util.h"
#include "vmm/vm.h"
#include "vmm/x86_boot.h"

#define PROBE_LOOPS 1000000u
#define PROBE_PORT  0x80
/* Below this guest/host speed ratio, guest ring-0 code is being emulated, not run. */
#define NATIVE_RATIO_MIN 0.1

struct cap_check {
	int cap;
	const char *name;
	int needed; /* cove refuses to start without it */
};

static const struct cap_check caps[] = {
    {KVM_CAP_USER_MEMORY, "USER_MEMORY", 1},
    {KVM_CAP_IRQCHIP, "IRQCHIP", 1},
    {KVM_CAP_PIT2, "PIT2", 1},
    {KVM_CAP_IRQFD, "IRQFD", 1},
    {KVM_CAP_IOEVENTFD, "IOEVENTFD", 1},
    {KVM_CAP_IMMEDIATE_EXIT, "IMMEDIATE_EXIT", 1},
    {KVM_CAP_EXT_CPUID, "EXT_CPUID", 1},
    {KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2, "MANUAL_DIRTY_LOG_PROTECT2", 0},
    {KVM_CAP_DIRTY_LOG_RING, "DIRTY_LOG_RING", 0},
    {KVM_CAP_READONLY_MEM, "READONLY_MEM", 0},
    {KVM_CAP_SPLIT_IRQCHIP, "SPLIT_IRQCHIP", 0},
    {KVM_CAP_XSAVE, "XSAVE", 0},
    {KVM_CAP_XCRS, "XCRS", 0},
    {KVM_CAP_ADJUST_CLOCK, "ADJUST_CLOCK", 0},
    {KVM_CAP_VCPU_EVENTS, "VCPU_EVENTS", 0},
};

/* The same dec/jnz loop the probe guest runs, on the host CPU, for the ratio. */
static double host_loop_rate(void)
{
	double t0 = mono_s();
	unsigned n = PROBE_LOOPS * 20;
	__asm__ volatile("1: dec %0\n\tjnz 1b" : "+r"(n));
	return (double)PROBE_LOOPS * 20 / (mono_s() - t0);
}

/*
 * A ring-0 guest: out (start mark), PROBE_LOOPS x dec/jnz, out (end mark), hlt.
 * Timing between the two port exits leaves VM creation out of the figure.
 */
static int guest_loop_rate(struct logger *log, double *rate)
{
	static const uint8_t code_head[] = {0xe6, PROBE_PORT, 0xb9};
	static const uint8_t code_tail[] = {0xff, 0xc9, 0x75, 0xfc, 0xe6, PROBE_PORT, 0xf4};
	struct vm *vm = calloc(1, sizeof(*vm));
	if (!vm)
		return -ENOMEM;
	struct vm_config cfg = {.mem_size = 4ULL << 20, .nr_vcpus = 1};
	int r = vm_create(vm, &cfg, log);
	if (r) {
		free(vm);
		return r;
	}
	uint8_t *code = guest_mem_ptr(&vm->mem, HIMEM_START, 64);
	uint32_t loops = PROBE_LOOPS;
	memcpy(code, code_head, sizeof(code_head));
	memcpy(code + sizeof(code_head), &loops, sizeof(loops));
	memcpy(code + sizeof(code_head) + 4, code_tail, sizeof(code_tail));
	r = x86_boot_write_tables(&vm->mem, false);
	if (!r)
		r = x86_boot_setup_vcpu(&vm->vcpus[0], HIMEM_START, BOOT_LONG_MODE);
	double t_start = 0;
	int marks = 0;
	while (!r && marks < 2) {
		if (ioctl(vm->vcpus[0].fd, KVM_RUN, NULL) < 0) {
			if (errno == EINTR)
				continue;
			r = -errno;
			break;
		}
		struct kvm_run *run = vm->vcpus[0].run;
		if (run->exit_reason == KVM_EXIT_IO && run->io.port == PROBE_PORT) {
			if (marks++ == 0)
				t_start = mono_s();
			else
				*rate = PROBE_LOOPS / (mono_s() - t_start);
		} else {
			log_err(log, "probe guest stopped with exit %u", run->exit_reason);
			r = -EIO;
		}
	}
	vm_destroy(vm);
	free(vm);
	return r;
}

static const char *kvm_module(void)
{
	static const char *const mods[] = {"kvm_pvm", "kvm_intel", "kvm_amd"};
	for (size_t i = 0; i < sizeof(mods) / sizeof(mods[0]); i++) {
		char path[64];
		snprintf(path, sizeof(path), "/sys/module/%s", mods[i]);
		if (access(path, F_OK) == 0)
			return mods[i];
	}
	return "unknown";
}

int cmd_doctor(int argc, char **argv)
{
	if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
		printf("usage: cove doctor\n"
		       "Report what /dev/kvm offers and whether guest kernels run natively here.\n"
		       "Exit status: 0 Linux guests run here, 3 /dev/kvm works but only for small\n"
		       "test guests (use tools/kvm-box), 1 no usable /dev/kvm.\n");
		return 0;
	}
	if (argc > 1) {
		fprintf(stderr, "cove doctor: unexpected argument '%s'\n", argv[1]);
		return 2;
	}
	struct logger log = {.level = LOG_ERROR, .out = stderr};
	int fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		printf("/dev/kvm: cannot open: %s\n", strerror(errno));
		printf("verdict: no KVM here; cove cannot run guests on this host\n");
		return 1;
	}
	int api = ioctl(fd, KVM_GET_API_VERSION, NULL);
	printf("/dev/kvm: API version %d, module %s\n", api, kvm_module());
	int missing = 0;
	for (size_t i = 0; i < sizeof(caps) / sizeof(caps[0]); i++) {
		int v = ioctl(fd, KVM_CHECK_EXTENSION, caps[i].cap);
		printf("  %-28s %s%s\n", caps[i].name, v > 0 ? "yes" : "no",
		       caps[i].needed ? " (required)" : "");
		if (v <= 0 && caps[i].needed)
			missing++;
	}
	close(fd);
	if (missing) {
		printf("verdict: %d required capabilities missing; cove cannot run here\n",
		       missing);
		return 1;
	}
	double host = host_loop_rate(), guest = 0;
	int r = guest_loop_rate(&log, &guest);
	if (r) {
		printf("probe guest: failed (%s)\n", strerror(-r));
		printf("verdict: cove cannot run guests on this /dev/kvm\n");
		return 1;
	}
	double ratio = guest / host;
	printf("ring-0 probe: guest %.1fM loop iterations/s, host %.1fM/s, ratio %.2g\n",
	       guest / 1e6, host / 1e6, ratio);
	if (ratio < NATIVE_RATIO_MIN) {
		printf("verdict: guest ring-0 code is emulated here (about %.0fx slower than the "
		       "host),\n"
		       "  as on nested PVM: small test guests run, Linux guests will not boot.\n"
		       "  Run Linux sandboxes inside the KVM box instead: tools/kvm-box (see "
		       "tools/BOX.md).\n",
		       1.0 / ratio);
		return 3;
	}
	printf("verdict: guest ring-0 code runs natively; Linux guests run here\n");
	return 0;
}
