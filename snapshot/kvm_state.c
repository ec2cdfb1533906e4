/* Saves and restores what KVM holds for a VM: every vCPU's registers and the irqchip, PIT and
 * clock. */
#include "snapshot/kvm_state.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <linux/kvm.h>

#include "common/errmsg.h"
#include "snapshot/cpu_compat.h"
#include "vmm/cpuid.h"
#include "vmm/kvm_util.h"
#include "vmm/vm.h"

#define MAX_MSRS 256

_Static_assert(sizeof(struct kvm_cpuid_entry2) == STATE_CPUID_ENTRY_SIZE,
	       "the state file's CPUID entry is KVM's struct");

/* The MSRs KVM saves and restores for this host: what a snapshot may hold. NULL on error. */
static struct kvm_msr_list *msr_index_list(struct vm *vm)
{
	struct kvm_msr_list *list = calloc(1, sizeof(*list) + MAX_MSRS * sizeof(uint32_t));
	if (!list)
		return NULL;
	list->nmsrs = MAX_MSRS;
	if (KVM_IOCTL(vm->log, vm->kvm_fd, KVM_GET_MSR_INDEX_LIST, list) < 0) {
		free(list);
		return NULL;
	}
	return list;
}

static int save_msrs(struct vm *vm, struct vcpu *v, struct state_buf *b)
{
	struct kvm_msr_list *list = msr_index_list(vm);
	struct kvm_msrs *msrs = calloc(1, sizeof(*msrs) + MAX_MSRS * sizeof(struct kvm_msr_entry));
	int r = -ENOMEM;
	if (!list || !msrs)
		goto out;
	/*
	 * KVM_GET_MSRS stops at the first MSR it cannot read and returns how many it read:
	 * keep those, skip the failing one, and go on with the rest.
	 */
	uint32_t kept = 0, next = 0;
	while (next < list->nmsrs) {
		uint32_t want = list->nmsrs - next;
		struct kvm_msrs *tmp =
		    calloc(1, sizeof(*tmp) + want * sizeof(struct kvm_msr_entry));
		if (!tmp) {
			r = -ENOMEM;
			goto out;
		}
		tmp->nmsrs = want;
		for (uint32_t i = 0; i < want; i++)
			tmp->entries[i].index = list->indices[next + i];
		r = kvm_ioctl_raw(v->fd, KVM_GET_MSRS, tmp);
		if (r < 0) {
			free(tmp);
			log_err(vm->log, "KVM_GET_MSRS failed: %s", strerror(-r));
			goto out;
		}
		for (int i = 0; i < r; i++)
			msrs->entries[kept++] = tmp->entries[i];
		free(tmp);
		next += (uint32_t)r + 1; /* entry r (if any) could not be read */
	}
	state_put(b, SEC_VCPU_MSRS, (uint32_t)v->id, msrs->entries,
		  kept * sizeof(struct kvm_msr_entry));
	r = 0;
out:
	free(list);
	free(msrs);
	return r;
}

static int save_vcpu(struct vm *vm, struct vcpu *v, struct state_buf *b)
{
	uint32_t id = (uint32_t)v->id;
	struct kvm_mp_state mp;
	struct kvm_regs regs;
	struct kvm_sregs sregs;
	struct kvm_xcrs xcrs;
	struct kvm_lapic_state lapic;
	struct kvm_vcpu_events ev;
	struct kvm_debugregs dbg;
	struct kvm_xsave *xs = calloc(1, sizeof(*xs));
	int r;
	if (!xs)
		return -ENOMEM;
	if ((r = KVM_IOCTL(vm->log, v->fd, KVM_GET_MP_STATE, &mp)) < 0 ||
	    (r = KVM_IOCTL(vm->log, v->fd, KVM_GET_REGS, &regs)) < 0 ||
	    (r = KVM_IOCTL(vm->log, v->fd, KVM_GET_SREGS, &sregs)) < 0 ||
	    (r = KVM_IOCTL(vm->log, v->fd, KVM_GET_XSAVE, xs)) < 0 ||
	    (r = KVM_IOCTL(vm->log, v->fd, KVM_GET_XCRS, &xcrs)) < 0 ||
	    (r = KVM_IOCTL(vm->log, v->fd, KVM_GET_DEBUGREGS, &dbg)) < 0 ||
	    (r = KVM_IOCTL(vm->log, v->fd, KVM_GET_LAPIC, &lapic)) < 0)
		goto out;
	r = save_msrs(vm, v, b);
	if (r)
		goto out;
	/* What this vCPU was given by KVM_SET_CPUID2: a later host is checked against it. */
	struct kvm_cpuid2 *c = cpuid_for_vcpu(vm->cpuid, v->id, vm->nr_vcpus);
	if (!c) {
		r = -ENOMEM;
		goto out;
	}
	if (c->nent > STATE_MAX_CPUID) {
		free(c);
		r = -E2BIG;
		goto out;
	}
	state_put(b, SEC_VCPU_CPUID, id, c->entries, c->nent * sizeof(c->entries[0]));
	free(c);
	/* Events last: reading the others must not change what is pending. */
	if ((r = KVM_IOCTL(vm->log, v->fd, KVM_GET_VCPU_EVENTS, &ev)) < 0)
		goto out;
	state_put(b, SEC_VCPU_MP_STATE, id, &mp, sizeof(mp));
	state_put(b, SEC_VCPU_REGS, id, &regs, sizeof(regs));
	state_put(b, SEC_VCPU_SREGS, id, &sregs, sizeof(sregs));
	state_put(b, SEC_VCPU_XSAVE, id, xs, sizeof(*xs));
	state_put(b, SEC_VCPU_XCRS, id, &xcrs, sizeof(xcrs));
	state_put(b, SEC_VCPU_DEBUGREGS, id, &dbg, sizeof(dbg));
	state_put(b, SEC_VCPU_LAPIC, id, &lapic, sizeof(lapic));
	state_put(b, SEC_VCPU_EVENTS, id, &ev, sizeof(ev));
	r = 0;
out:
	free(xs);
	return r < 0 ? r : 0;
}

int kvm_state_save(struct vm *vm, struct state_buf *b)
{
	struct kvm_pit_state2 pit;
	struct kvm_clock_data clock;
	int r;

	memset(&clock, 0, sizeof(clock));
	if ((r = KVM_IOCTL(vm->log, vm->vm_fd, KVM_GET_CLOCK, &clock)) < 0)
		return r;
	if ((r = KVM_IOCTL(vm->log, vm->vm_fd, KVM_GET_PIT2, &pit)) < 0)
		return r;
	state_put(b, SEC_CLOCK, 0, &clock, sizeof(clock));
	state_put(b, SEC_PIT, 0, &pit, sizeof(pit));
	for (uint32_t chip = 0; chip < 3; chip++) {
		struct kvm_irqchip ic;
		memset(&ic, 0, sizeof(ic));
		ic.chip_id = chip; /* 0 PIC master, 1 PIC slave, 2 IOAPIC */
		if ((r = KVM_IOCTL(vm->log, vm->vm_fd, KVM_GET_IRQCHIP, &ic)) < 0)
			return r;
		state_put(b, SEC_IRQCHIP, chip, &ic, sizeof(ic));
	}
	for (int i = 0; i < vm->nr_vcpus; i++) {
		r = save_vcpu(vm, &vm->vcpus[i], b);
		if (r)
			return r;
	}
	return b->err;
}

/* The section of exactly `len` bytes, or an error naming it. */
static const void *need(const struct state_section_ref *s, size_t n, uint32_t type, uint32_t inst,
			size_t len, const char *what, char *err, size_t errlen)
{
	const struct state_section_ref *sec = state_find(s, n, type, inst);
	if (!sec) {
		errmsg(err, errlen, -EINVAL, "state file has no %s for %u", what, inst);
		return NULL;
	}
	if (sec->len != len) {
		errmsg(err, errlen, -EINVAL, "state file: %s for %u has %u bytes, expected %zu",
		       what, inst, sec->len, len);
		return NULL;
	}
	return sec->payload;
}

/* Sets VM-wide state; a failure names the ioctl. */
#define SET(fd, req, p)                                                                            \
	do {                                                                                       \
		int _r = kvm_ioctl_raw((fd), (req), (void *)(p));                                  \
		if (_r < 0)                                                                        \
			return errmsg(err, errlen, _r, "restoring state: %s failed: %s", #req,     \
				      strerror(-_r));                                              \
	} while (0)

static void log_note(void *ctx, int warn, const char *line)
{
	struct vm *vm = ctx;
	if (warn)
		log_warn(vm->log, "%s", line);
	else
		log_info(vm->log, "%s", line);
}

/*
 * The CPU-state rule (cpu_compat.c): the MSRs both sides have go to `msrs` for KVM_SET_MSRS,
 * the chain's other MSRs are dropped or refused per CPU_COMPAT.md, and the CPUID the guest saw
 * must be what this host offers. The values are KVM's to check (KVM_SET_MSRS stops at the
 * first one it refuses; set_msrs deals with that).
 */
static int check_cpu(struct vm *vm, uint32_t id, const struct state_section_ref *s, size_t n,
		     const struct kvm_msr_entry *saved, uint32_t nsaved, struct kvm_msrs *msrs,
		     struct kvm_xsave *xs, const struct kvm_xcrs *xcrs,
		     const struct kvm_sregs *sregs, char *err, size_t errlen)
{
	struct kvm_msr_list *list = msr_index_list(vm);
	if (!list)
		return errmsg(err, errlen, -EIO, "restoring vCPU %u: cannot list KVM's MSRs", id);
	struct kvm_cpuid2 *host = cpuid_for_vcpu(vm->cpuid, (int)id, vm->nr_vcpus);
	struct kvm_cpuid_entry2 *seen = NULL;
	const struct state_section_ref *csec = state_find(s, n, SEC_VCPU_CPUID, id);
	int r = -ENOMEM;
	if (!host)
		goto out;
	if (csec && csec->len) {
		/* A copy: the payload is only 8-byte aligned. state_parse bounded its size. */
		seen = malloc(csec->len);
		if (!seen)
			goto out;
		memcpy(seen, csec->payload, csec->len);
	}
	struct cpu_compat_in in = {
	    .vcpu = id,
	    .msrs = saved,
	    .nmsrs = nsaved,
	    .host_msrs = list->indices,
	    .nhost_msrs = list->nmsrs,
	    .cpuid = seen,
	    .ncpuid = csec ? csec->len / (uint32_t)sizeof(*seen) : 0,
	    .host_cpuid = host->entries,
	    .nhost_cpuid = host->nent,
	};
	r = cpu_compat_check(&in, msrs->entries, &msrs->nmsrs, log_note, vm, err, errlen);
	if (r)
		goto out;
	/* XSAVE state the guest holds must fit this host's XSAVE features (CPUID 0xD.0). */
	uint64_t xcr0 = 1, host_xf = 0;
	for (uint32_t i = 0; i < xcrs->nr_xcrs && i < KVM_MAX_XCRS; i++)
		if (xcrs->xcrs[i].xcr == 0)
			xcr0 = xcrs->xcrs[i].value;
	for (uint32_t i = 0; i < host->nent; i++)
		if (host->entries[i].function == 0xd && host->entries[i].index == 0)
			host_xf = host->entries[i].eax | (uint64_t)host->entries[i].edx << 32;
	r = cpu_compat_xsave(id, (uint8_t *)xs->region, sizeof(xs->region), xcr0, sregs->cr4,
			     host_xf, log_note, vm, err, errlen);
out:
	free(seen);
	free(host);
	free(list);
	return r;
}

/*
 * KVM_SET_MSRS stops at the first value KVM refuses. Such an MSR that the table lets go (a
 * description of the old host, say) is dropped with a log line and the rest are set; any other
 * is named.
 */
static int set_msrs(struct vm *vm, struct vcpu *v, struct kvm_msrs *msrs, char *err, size_t errlen)
{
	uint32_t id = (uint32_t)v->id, total = msrs->nmsrs, done = 0;
	while (msrs->nmsrs) {
		int k = kvm_ioctl_raw(v->fd, KVM_SET_MSRS, msrs);
		if (k < 0)
			return errmsg(err, errlen, k, "restoring vCPU %u: KVM_SET_MSRS failed: %s",
				      id, strerror(-k));
		if ((uint32_t)k >= msrs->nmsrs)
			return 0;
		const struct kvm_msr_entry *e = &msrs->entries[k];
		const char *name = cpu_msr_name(e->index);
		if (!cpu_msr_droppable(e->index, e->data))
			return errmsg(
			    err, errlen, -EINVAL,
			    "restoring vCPU %u: KVM refused MSR 0x%x%s%s = 0x%llx (%u of %u "
			    "set)",
			    id, e->index, name ? " " : "", name ? name : "",
			    (unsigned long long)e->data, done + (uint32_t)k, total);
		log_warn(vm->log,
			 "vCPU %u: MSR 0x%x %s = 0x%llx dropped: this host's KVM refused the value "
			 "and CPU_COMPAT.md lets it go",
			 id, e->index, name, (unsigned long long)e->data);
		done += (uint32_t)k;
		uint32_t rest = msrs->nmsrs - (uint32_t)k - 1;
		memmove(msrs->entries, msrs->entries + k + 1, rest * sizeof(msrs->entries[0]));
		msrs->nmsrs = rest;
	}
	return 0;
}

/*
 * The vCPU blobs (registers, XSAVE, LAPIC, events, MP state...) are KVM's own structs: we
 * check that each has exactly the size KVM's API defines and leave their contents to KVM,
 * which validates them on every KVM_SET_* (reserved bits, xstate_bv, APIC mode, exception
 * vectors, MP state values) exactly as it does for a live VMM.
 */
static int restore_vcpu(struct vm *vm, struct vcpu *v, const struct state_section_ref *s, size_t n,
			char *err, size_t errlen)
{
	uint32_t id = (uint32_t)v->id;
	const void *mp, *regs, *sregs, *xs, *xcrs, *dbg, *lapic, *ev;
	if (!(mp = need(s, n, SEC_VCPU_MP_STATE, id, sizeof(struct kvm_mp_state), "vCPU MP state",
			err, errlen)) ||
	    !(regs = need(s, n, SEC_VCPU_REGS, id, sizeof(struct kvm_regs), "vCPU registers", err,
			  errlen)) ||
	    !(sregs = need(s, n, SEC_VCPU_SREGS, id, sizeof(struct kvm_sregs),
			   "vCPU special registers", err, errlen)) ||
	    !(xs = need(s, n, SEC_VCPU_XSAVE, id, sizeof(struct kvm_xsave), "vCPU XSAVE area", err,
			errlen)) ||
	    !(xcrs = need(s, n, SEC_VCPU_XCRS, id, sizeof(struct kvm_xcrs), "vCPU XCRs", err,
			  errlen)) ||
	    !(dbg = need(s, n, SEC_VCPU_DEBUGREGS, id, sizeof(struct kvm_debugregs),
			 "vCPU debug registers", err, errlen)) ||
	    !(lapic = need(s, n, SEC_VCPU_LAPIC, id, sizeof(struct kvm_lapic_state), "vCPU LAPIC",
			   err, errlen)) ||
	    !(ev = need(s, n, SEC_VCPU_EVENTS, id, sizeof(struct kvm_vcpu_events), "vCPU events",
			err, errlen)))
		return -EINVAL;
	const struct state_section_ref *msec = state_find(s, n, SEC_VCPU_MSRS, id);
	if (!msec || msec->len % sizeof(struct kvm_msr_entry) ||
	    msec->len / sizeof(struct kvm_msr_entry) > MAX_MSRS)
		return errmsg(err, errlen, -EINVAL,
			      "state file: MSR list of vCPU %u is missing or bad", id);

	/* Copies: the payloads are only 8-byte aligned and KVM may write some structs back. */
	struct kvm_mp_state m;
	struct kvm_regs r;
	struct kvm_sregs sr;
	struct kvm_xcrs x;
	struct kvm_debugregs d;
	struct kvm_lapic_state l;
	struct kvm_vcpu_events e;
	memcpy(&m, mp, sizeof(m));
	memcpy(&r, regs, sizeof(r));
	memcpy(&sr, sregs, sizeof(sr));
	memcpy(&x, xcrs, sizeof(x));
	memcpy(&d, dbg, sizeof(d));
	memcpy(&l, lapic, sizeof(l));
	memcpy(&e, ev, sizeof(e));
	struct kvm_xsave *xsave = malloc(sizeof(*xsave));
	uint32_t nmsrs = msec->len / (uint32_t)sizeof(struct kvm_msr_entry);
	struct kvm_msrs *msrs = calloc(1, sizeof(*msrs) + msec->len);
	if (!xsave || !msrs) {
		free(xsave);
		free(msrs);
		return -ENOMEM;
	}
	memcpy(xsave, xs, sizeof(*xsave));
	struct kvm_msr_entry *saved = malloc(msec->len ? msec->len : 1);
	if (!saved) {
		free(xsave);
		free(msrs);
		return -ENOMEM;
	}
	memcpy(saved, msec->payload, msec->len);
	int rc = check_cpu(vm, id, s, n, saved, nmsrs, msrs, xsave, &x, &sr, err, errlen);
	free(saved);
	if (rc) {
		free(xsave);
		free(msrs);
		return rc;
	}
	/* Firecracker's order: the LAPIC before the MSRs (TSC deadline), events last. */
	static const unsigned long reqs[] = {KVM_SET_MP_STATE, KVM_SET_REGS, KVM_SET_SREGS,
					     KVM_SET_XSAVE,    KVM_SET_XCRS, KVM_SET_DEBUGREGS,
					     KVM_SET_LAPIC,    KVM_SET_MSRS, KVM_SET_VCPU_EVENTS};
	static const char *const names[] = {
	    "KVM_SET_MP_STATE", "KVM_SET_REGS", "KVM_SET_SREGS",
	    "KVM_SET_XSAVE",	"KVM_SET_XCRS", "KVM_SET_DEBUGREGS",
	    "KVM_SET_LAPIC",	"KVM_SET_MSRS", "KVM_SET_VCPU_EVENTS"};
	void *args[] = {&m, &r, &sr, xsave, &x, &d, &l, msrs, &e};
	e.flags |= KVM_VCPUEVENT_VALID_NMI_PENDING | KVM_VCPUEVENT_VALID_SIPI_VECTOR |
		   KVM_VCPUEVENT_VALID_SHADOW;
	for (size_t i = 0; i < sizeof(reqs) / sizeof(reqs[0]); i++) {
		if (reqs[i] == KVM_SET_MSRS) {
			rc = set_msrs(vm, v, msrs, err, errlen);
			if (rc)
				break;
			continue;
		}
		int k = kvm_ioctl_raw(v->fd, reqs[i], args[i]);
		if (k < 0) {
			rc = errmsg(err, errlen, k, "restoring vCPU %u: %s failed: %s", id,
				    names[i], strerror(-k));
			break;
		}
	}
	free(xsave);
	free(msrs);
	return rc;
}

/*
 * The PIT, PIC/IOAPIC and clock blobs are KVM's: sizes and the chip ids are checked here, the
 * contents by KVM_SET_PIT2/KVM_SET_IRQCHIP/KVM_SET_CLOCK, which bound every index they use.
 */
int kvm_state_restore(struct vm *vm, const struct state_section_ref *s, size_t n, char *err,
		      size_t errlen)
{
	const void *p;
	struct kvm_pit_state2 pit;
	struct kvm_clock_data clock;

	if (!(p = need(s, n, SEC_PIT, 0, sizeof(pit), "PIT state", err, errlen)))
		return -EINVAL;
	memcpy(&pit, p, sizeof(pit));
	SET(vm->vm_fd, KVM_SET_PIT2, &pit);
	if (!(p = need(s, n, SEC_CLOCK, 0, sizeof(clock), "KVM clock", err, errlen)))
		return -EINVAL;
	memcpy(&clock, p, sizeof(clock));
	/* Only the clock value: the TSC-stable and realtime fields belong to the old host. */
	clock.flags = 0;
	SET(vm->vm_fd, KVM_SET_CLOCK, &clock);
	for (uint32_t chip = 0; chip < 3; chip++) {
		struct kvm_irqchip ic;
		if (!(p = need(s, n, SEC_IRQCHIP, chip, sizeof(ic), "irqchip", err, errlen)))
			return -EINVAL;
		memcpy(&ic, p, sizeof(ic));
		if (ic.chip_id != chip)
			return errmsg(err, errlen, -EINVAL, "state file: irqchip %u names chip %u",
				      chip, ic.chip_id);
		SET(vm->vm_fd, KVM_SET_IRQCHIP, &ic);
	}
	for (int i = 0; i < vm->nr_vcpus; i++) {
		int r = restore_vcpu(vm, &vm->vcpus[i], s, n, err, errlen);
		if (r)
			return r;
	}
	return 0;
}
