/* Unit tests for the CPU-state rule (snapshot/cpu_compat) and the state file's CPUID section. */
#include "helpers.h"

#include "common/byteorder.h"
#include "common/crc32.h"
#include "cpu_lists.h"
#include "snapshot/cpu_compat.h"
#include "snapshot/state_file.h"

#define N(a) (sizeof(a) / sizeof((a)[0]))

struct notes {
	char line[128][512];
	int n, warns;
};

static void collect(void *ctx, int warn, const char *line)
{
	struct notes *ns = ctx;
	assert_true(ns->n < 128);
	snprintf(ns->line[ns->n++], sizeof(ns->line[0]), "%s", line);
	ns->warns += warn != 0;
}

static bool noted(const struct notes *ns, const char *text)
{
	for (int i = 0; i < ns->n; i++)
		if (strstr(ns->line[i], text))
			return true;
	return false;
}

/* The indices of `e`, minus those in `drop`, plus `extra`: a host's KVM_GET_MSR_INDEX_LIST. */
static uint32_t host_list(uint32_t *out, const struct kvm_msr_entry *e, size_t n,
			  const uint32_t *drop, size_t ndrop, const uint32_t *extra, size_t nextra)
{
	uint32_t k = 0;
	for (size_t i = 0; i < n; i++) {
		bool skip = false;
		for (size_t j = 0; j < ndrop; j++)
			skip |= e[i].index == drop[j];
		if (!skip)
			out[k++] = e[i].index;
	}
	for (size_t j = 0; j < nextra; j++)
		out[k++] = extra[j];
	return k;
}

struct run {
	struct kvm_msr_entry keep[256];
	uint32_t nkeep;
	struct notes notes;
	char err[1024];
	int rc;
};

static void check(struct run *r, const struct kvm_msr_entry *msrs, uint32_t n, const uint32_t *host,
		  uint32_t nhost, const struct kvm_cpuid_entry2 *cpuid, uint32_t ncpuid,
		  const struct kvm_cpuid_entry2 *hcpuid, uint32_t nhcpuid)
{
	memset(r, 0, sizeof(*r));
	struct cpu_compat_in in = {.vcpu = 0,
				   .msrs = msrs,
				   .nmsrs = n,
				   .host_msrs = host,
				   .nhost_msrs = nhost,
				   .cpuid = cpuid,
				   .ncpuid = ncpuid,
				   .host_cpuid = hcpuid,
				   .nhost_cpuid = nhcpuid};
	r->rc =
	    cpu_compat_check(&in, r->keep, &r->nkeep, collect, &r->notes, r->err, sizeof(r->err));
}

/*
 * chain-v2 against a 40-MSR host that lacks three of its 43. Which three the failing machine
 * lacked is not recorded; these are the chain-v2 MSRs that KVM lists only after probing the host
 * CPU (TSX_CTRL: needs TSX_CTRL in the host's ARCH_CAPABILITIES, the KVM box lacks it;
 * FEAT_CTL: Intel's; VM_HSAVE_PA: AMD's, each listed only when the host answers a read of it).
 * test_chain_v2_any_three covers every other choice.
 */
static void test_chain_v2_on_40(void **state)
{
	(void)state;
	static const uint32_t gone[] = {0x122, 0x3a, 0xc0010117};
	uint32_t host[64];
	uint32_t nh = host_list(host, v2_msrs, N(v2_msrs), gone, N(gone), NULL, 0);
	assert_int_equal(N(v2_msrs), 43);
	assert_int_equal(nh, 40);
	struct run r;
	check(&r, v2_msrs, N(v2_msrs), host, nh, NULL, 0, NULL, 0);
	assert_int_equal(r.rc, 0);
	assert_int_equal(r.nkeep, 40);
	for (uint32_t i = 0; i < r.nkeep; i++)
		for (size_t j = 0; j < N(gone); j++)
			assert_int_not_equal(r.keep[i].index, gone[j]);
	/* One warning line per dropped MSR, naming it and why, and one for the skipped CPUID. */
	assert_true(noted(&r.notes, "vCPU 0: MSR 0x122 IA32_TSX_CTRL dropped (this host's KVM does "
				    "not save it): it holds its reset value; "));
	assert_true(noted(&r.notes, "MSR 0x3a IA32_FEAT_CTL dropped"));
	assert_true(noted(&r.notes, "MSR 0xc0010117 VM_HSAVE_PA dropped"));
	assert_true(noted(&r.notes, "the chain recorded no CPUID"));
	assert_int_equal(r.notes.warns, 4);
	assert_int_equal(r.notes.n, 4);
}

/*
 * Another reading of the 40: the kernel that wrote chain-v2 listed DEBUGCTL and the four LBR
 * MSRs (their order in chain-v2 is that of the late-2025 KVM patch adding them), a 6.18 kernel
 * does not, and it lists two the chain lacks. Restorable as well; the two are named.
 */
static void test_chain_v2_without_lbr(void **state)
{
	(void)state;
	static const uint32_t gone[] = {0x1d9, 0x1db, 0x1dc, 0x1dd, 0x1de};
	static const uint32_t extra[] = {0xc0000103, 0xda0};
	uint32_t host[64];
	uint32_t nh = host_list(host, v2_msrs, N(v2_msrs), gone, N(gone), extra, N(extra));
	assert_int_equal(nh, 40);
	struct run r;
	check(&r, v2_msrs, N(v2_msrs), host, nh, NULL, 0, NULL, 0);
	assert_int_equal(r.rc, 0);
	assert_int_equal(r.nkeep, 38);
	assert_true(noted(&r.notes, "MSR 0x1db LASTBRANCHFROMIP dropped (this host's KVM does not "
				    "save it): a record of the last branch"));
	assert_true(noted(&r.notes, "MSR 0x1d9 IA32_DEBUGCTL dropped"));
	assert_true(noted(&r.notes, "2 MSRs this host saves are not in the chain and keep KVM's "
				    "reset value: 0xc0000103 TSC_AUX, 0xda0 IA32_XSS"));
}

/*
 * Whatever three a 40-MSR host lacks, chain-v2 restores unless one is among the eleven every
 * x86-64 KVM lists (syscall MSRs, TSC, PAT, MISC_ENABLE); each of those is refused by name.
 */
static void test_chain_v2_any_three(void **state)
{
	(void)state;
	static const uint32_t always[] = {0x174,      0x175,	  0x176,      0xc0000081,
					  0xc0000082, 0xc0000083, 0xc0000084, 0xc0000102,
					  0x10,	      0x277,	  0x1a0};
	uint32_t drop[43];
	size_t nd = 0;
	for (size_t i = 0; i < N(v2_msrs); i++) {
		bool a = false;
		for (size_t j = 0; j < N(always); j++)
			a |= v2_msrs[i].index == always[j];
		if (!a)
			drop[nd++] = v2_msrs[i].index;
	}
	assert_int_equal(nd, 32);
	unsigned combos = 0;
	struct run *r = malloc(sizeof(*r));
	assert_non_null(r);
	for (size_t a = 0; a < nd; a++)
		for (size_t b = a + 1; b < nd; b++)
			for (size_t c = b + 1; c < nd; c++) {
				uint32_t gone[3] = {drop[a], drop[b], drop[c]}, host[64];
				uint32_t nh =
				    host_list(host, v2_msrs, N(v2_msrs), gone, 3, NULL, 0);
				check(r, v2_msrs, N(v2_msrs), host, nh, NULL, 0, NULL, 0);
				assert_int_equal(r->rc, 0);
				assert_int_equal(r->nkeep, 40);
				assert_int_equal(r->notes.warns, 4);
				combos++;
			}
	assert_int_equal(combos, 4960);
	for (size_t j = 0; j < N(always); j++) {
		uint32_t host[64];
		uint32_t nh = host_list(host, v2_msrs, N(v2_msrs), &always[j], 1, NULL, 0);
		check(r, v2_msrs, N(v2_msrs), host, nh, NULL, 0, NULL, 0);
		assert_int_equal(r->rc, -ENOEXEC);
		char want[64];
		snprintf(want, sizeof(want), "MSR 0x%x %s (", always[j], cpu_msr_name(always[j]));
		assert_non_null(strstr(r->err, want));
	}
	free(r);
}

/* An armed TSC deadline is refused with its value; a disarmed one is dropped with a log line. */
static void test_refused_msr_names_it(void **state)
{
	(void)state;
	struct kvm_msr_entry msrs[] = {{.index = 0x10, .data = 5},
				       {.index = 0x6e0, .data = 0x1234}};
	uint32_t host[] = {0x10};
	struct run r;
	check(&r, msrs, 2, host, 1, NULL, 0, NULL, 0);
	assert_int_equal(r.rc, -ENOEXEC);
	assert_string_equal(r.err, "this host cannot take vCPU 0's CPU state: MSR 0x6e0 "
				   "IA32_TSC_DEADLINE = 0x1234, not its reset value 0x0 (an armed "
				   "LAPIC timer: dropped, its interrupt never comes)");
	msrs[1].data = 0;
	check(&r, msrs, 2, host, 1, NULL, 0, NULL, 0);
	assert_int_equal(r.rc, 0);
	assert_int_equal(r.nkeep, 1);
	assert_int_equal(r.keep[0].index, 0x10);
	assert_true(noted(&r.notes, "MSR 0x6e0 IA32_TSC_DEADLINE dropped"));

	/* A refuse-always MSR, an unknown one, and both at once: all named on the one line. */
	struct kvm_msr_entry two[] = {{.index = 0xc0000082, .data = 0xffffffff81000000ull},
				      {.index = 0x12345678, .data = 7}};
	check(&r, two, 2, host, 1, NULL, 0, NULL, 0);
	assert_int_equal(r.rc, -ENOEXEC);
	assert_non_null(strstr(r.err, "MSR 0xc0000082 LSTAR (64-bit syscall entry the guest set)"));
	assert_non_null(strstr(r.err, "; MSR 0x12345678 = 0x7 (not in cove's table)"));
	assert_null(strchr(r.err, '\n'));

	/* A listed-twice MSR is a bad state file, whatever the host has. */
	struct kvm_msr_entry dup[] = {{.index = 0x10, .data = 1}, {.index = 0x10, .data = 2}};
	check(&r, dup, 2, host, 1, NULL, 0, NULL, 0);
	assert_int_equal(r.rc, -EINVAL);
	assert_non_null(strstr(r.err, "MSR 0x10 is listed twice"));
}

/* Drop-if-reset compares only the bits the guest can set (HWCR: McStatusWrEn). */
static void test_droppable_values(void **state)
{
	(void)state;
	assert_true(cpu_msr_droppable(0xc0010015, 1ull << 24));
	assert_false(cpu_msr_droppable(0xc0010015, 1ull << 18));
	assert_true(cpu_msr_droppable(0x9e, 0x30000));
	assert_false(cpu_msr_droppable(0x9e, 0));
	assert_true(cpu_msr_droppable(0x10a, 0x400000000c08e0ebull));
	assert_true(cpu_msr_droppable(0x40000020, 0x56d65d));
	assert_false(cpu_msr_droppable(0x40000001, 0x1001));
	assert_false(cpu_msr_droppable(0x10, 0));
	assert_false(cpu_msr_droppable(0x12345678, 0));
	/* Every MSR either real host lists has a rule: none is refused for being unknown. */
	for (size_t i = 0; i < N(box_msrs); i++)
		assert_non_null(cpu_msr_rule(box_msrs[i].index));
	for (size_t i = 0; i < N(v2_msrs); i++)
		assert_non_null(cpu_msr_rule(v2_msrs[i].index));
}

static struct kvm_cpuid_entry2 *box_cpuid_copy(void)
{
	struct kvm_cpuid_entry2 *c = malloc(sizeof(box_cpuid));
	assert_non_null(c);
	memcpy(c, box_cpuid, sizeof(box_cpuid));
	return c;
}

static struct kvm_cpuid_entry2 *leaf(struct kvm_cpuid_entry2 *c, size_t n, uint32_t fn,
				     uint32_t idx)
{
	for (size_t i = 0; i < n; i++)
		if (c[i].function == fn && c[i].index == idx)
			return &c[i];
	fail_msg("no leaf 0x%x.%u", fn, idx);
	return NULL;
}

/* A feature the guest saw and this host lacks is refused by leaf, register, bit and name. */
static void test_cpuid_feature_refused(void **state)
{
	(void)state;
	struct kvm_cpuid_entry2 *seen = box_cpuid_copy(), *host = box_cpuid_copy();
	uint32_t n = N(box_cpuid);
	uint32_t h[] = {0x10};
	struct kvm_msr_entry m[] = {{.index = 0x10, .data = 1}};
	struct run r;
	check(&r, m, 1, h, 1, seen, n, host, n);
	assert_int_equal(r.rc, 0);
	assert_int_equal(r.notes.n, 0);

	/* The box offers avx2 and adx (leaf 7 EBX bits 5, 19); a host without them. */
	leaf(host, n, 7, 0)->ebx &= ~((1u << 5) | (1u << 19));
	check(&r, m, 1, h, 1, seen, n, host, n);
	assert_int_equal(r.rc, -ENOEXEC);
	assert_string_equal(r.err,
			    "this host cannot take vCPU 0's CPU state: CPUID 0x7.0 EBX bit 5 "
			    "avx2 not offered here; CPUID 0x7.0 EBX bit 19 adx not offered "
			    "here");

	/* More on the host is fine; a leaf the host lacks entirely refuses the bits it had. */
	memcpy(host, box_cpuid, sizeof(box_cpuid));
	leaf(host, n, 1, 0)->ecx |= 1u << 5;
	leaf(host, n, 0x80000007, 0)->function = 0x80000099;
	leaf(seen, n, 0x80000007, 0)->edx = 1u << 8;
	check(&r, m, 1, h, 1, seen, n, host, n);
	assert_int_equal(r.rc, -ENOEXEC);
	assert_non_null(
	    strstr(r.err, "CPUID 0x80000007.0 EDX bit 8 invariant_tsc not offered here"));

	/* Another vendor: the guest chose vendor-specific code at boot. */
	memcpy(host, box_cpuid, sizeof(box_cpuid));
	memcpy(seen, box_cpuid, sizeof(box_cpuid));
	struct kvm_cpuid_entry2 *v = leaf(host, n, 0, 0);
	memcpy(&v->ebx, "Genu", 4);
	memcpy(&v->edx, "ineI", 4);
	memcpy(&v->ecx, "ntel", 4);
	check(&r, m, 1, h, 1, seen, n, host, n);
	assert_int_equal(r.rc, -ENOEXEC);
	assert_non_null(strstr(r.err, "CPUID 0x0 vendor AuthenticAMD (this host: GenuineIntel)"));
	free(seen);
	free(host);
}

/*
 * Both ways between the two real hosts, MSRs only (the CPUIDs differ by vendor and are refused
 * as test_cpuid_feature_refused shows): a box chain on chain-v2's host and chain-v2 in the box.
 */
static void test_between_box_and_pvm(void **state)
{
	(void)state;
	uint32_t host[128];
	struct run *r = malloc(sizeof(*r));
	assert_non_null(r);

	/* Box -> nested-PVM host: 60 box MSRs that host lacks, all at droppable values. */
	uint32_t nh = host_list(host, v2_msrs, N(v2_msrs), NULL, 0, NULL, 0);
	check(r, box_msrs, N(box_msrs), host, nh, NULL, 0, NULL, 0);
	assert_int_equal(r->rc, 0);
	assert_int_equal(r->nkeep, 37);
	assert_true(noted(&r->notes, "MSR 0x40000020 HV_X64_TIME_REF_COUNT dropped"));
	assert_true(noted(&r->notes, "MSR 0xc0000103 TSC_AUX dropped"));
	assert_true(noted(&r->notes, "6 MSRs this host saves are not in the chain"));
	/* ...unless the guest had armed a PMU counter there. */
	struct kvm_msr_entry armed[N(box_msrs)];
	memcpy(armed, box_msrs, sizeof(armed));
	for (size_t i = 0; i < N(armed); i++)
		if (armed[i].index == 0xc0010000)
			armed[i].data = 0x430076;
	check(r, armed, N(armed), host, nh, NULL, 0, NULL, 0);
	assert_int_equal(r->rc, -ENOEXEC);
	assert_non_null(
	    strstr(r->err, "MSR 0xc0010000 K7_EVNTSELx = 0x430076, not its reset value"));

	/* chain-v2 -> box: TSX_CTRL, DEBUGCTL and the four LBR records dropped. */
	nh = host_list(host, box_msrs, N(box_msrs), NULL, 0, NULL, 0);
	check(r, v2_msrs, N(v2_msrs), host, nh, NULL, 0, NULL, 0);
	assert_int_equal(r->rc, 0);
	assert_int_equal(r->nkeep, 37);
	assert_true(noted(&r->notes, "MSR 0x122 IA32_TSX_CTRL dropped"));
	assert_true(noted(&r->notes, "MSR 0x1de LASTINTTOIP dropped"));
	free(r);
}

/*
 * XSAVE: chain-v2's area (XSTATE_BV = 0x200, PKRU, which its PVM host saves; XCR0 = 1;
 * CR4.PKE off) in the KVM box, whose XSAVE features are x87|SSE|AVX: PKRU is unreachable and
 * dropped. Reachable state the host lacks is refused by component.
 */
static void test_xsave(void **state)
{
	(void)state;
	uint8_t xs[4096];
	memset(xs, 0, sizeof(xs));
	put_le64(xs + 512, 0x200);
	struct notes ns;
	memset(&ns, 0, sizeof(ns));
	char err[512];
	assert_int_equal(
	    cpu_compat_xsave(0, xs, sizeof(xs), 1, 0x20, 0x7, collect, &ns, err, sizeof(err)), 0);
	assert_int_equal(get_le64(xs + 512), 0);
	assert_true(noted(&ns, "vCPU 0: XSAVE component 9 pkru dropped (not offered here): the "
			       "guest never enabled it"));

	/* PKRU reachable through CR4.PKE. */
	put_le64(xs + 512, 0x203);
	assert_int_equal(cpu_compat_xsave(0, xs, sizeof(xs), 1, 0x20 | (1u << 22), 0x7, collect,
					  &ns, err, sizeof(err)),
			 -ENOEXEC);
	assert_string_equal(err, "this host cannot take vCPU 0's CPU state: XSAVE component 9 pkru "
				 "(in use; not offered here)");
	assert_int_equal(get_le64(xs + 512), 0x203);

	/* AVX enabled in XCR0, host without it: named once, as the XCR0 bit. */
	put_le64(xs + 512, 0x7);
	assert_int_equal(
	    cpu_compat_xsave(0, xs, sizeof(xs), 0x7, 0, 0x3, collect, &ns, err, sizeof(err)),
	    -ENOEXEC);
	assert_string_equal(err, "this host cannot take vCPU 0's CPU state: XCR0 bit 2 avx (the "
				 "guest enabled it; not offered here)");
	/* Everything offered: nothing changes, nothing noted. */
	int before = ns.n;
	assert_int_equal(
	    cpu_compat_xsave(0, xs, sizeof(xs), 0x7, 0, 0x207, collect, &ns, err, sizeof(err)), 0);
	assert_int_equal(get_le64(xs + 512), 0x7);
	assert_int_equal(ns.n, before);
	assert_int_equal(cpu_compat_xsave(0, xs, 100, 1, 0, 0x7, collect, &ns, err, sizeof(err)),
			 -EINVAL);
}

/* Rewrites a finished state file's version and CRCs. */
static void set_version(struct state_buf *b, uint32_t v)
{
	put_le32(b->p + 8, v);
	put_le32(b->p + 28, crc32_update(0, b->p, 28));
}

/* Version 2 carries CPUID; version 1 still loads; CPUID is size-checked on read. */
static void test_state_file_cpuid(void **state)
{
	(void)state;
	struct state_buf b;
	struct state_section_ref *s;
	size_t n;
	char err[256];
	state_buf_init(&b);
	state_put(&b, SEC_VCPU_CPUID, 0, box_cpuid, sizeof(box_cpuid));
	assert_int_equal(state_finish(&b), 0);
	assert_int_equal(get_le32(b.p + 8), 2);
	assert_int_equal(state_parse(b.p, b.len, &s, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 1);
	assert_int_equal(s[0].len, sizeof(box_cpuid));
	free(s);
	/* The section in a version-1 file is not one a version-1 writer made. */
	set_version(&b, 1);
	assert_int_equal(state_parse(b.p, b.len, &s, &n, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "CPUID of vCPU 0 is bad"));
	set_version(&b, 3);
	assert_int_equal(state_parse(b.p, b.len, &s, &n, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "version 3 is not supported"));
	state_buf_free(&b);

	/* A version-1 file without it loads. */
	state_buf_init(&b);
	state_put(&b, SEC_CONFIG, 0, "{}", 2);
	assert_int_equal(state_finish(&b), 0);
	set_version(&b, 1);
	assert_int_equal(state_parse(b.p, b.len, &s, &n, err, sizeof(err)), 0);
	free(s);
	state_buf_free(&b);

	/* Not whole entries, or more than the cap. */
	uint8_t big[(STATE_MAX_CPUID + 1) * STATE_CPUID_ENTRY_SIZE];
	memset(big, 0, sizeof(big));
	size_t bad[] = {STATE_CPUID_ENTRY_SIZE + 1, sizeof(big)};
	for (size_t i = 0; i < N(bad); i++) {
		state_buf_init(&b);
		state_put(&b, SEC_VCPU_CPUID, 0, big, bad[i]);
		assert_int_equal(state_finish(&b), 0);
		assert_int_equal(state_parse(b.p, b.len, &s, &n, err, sizeof(err)), -EINVAL);
		assert_non_null(strstr(err, "CPUID of vCPU 0 is bad"));
		state_buf_free(&b);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_chain_v2_on_40),
	    cmocka_unit_test(test_chain_v2_without_lbr),
	    cmocka_unit_test(test_chain_v2_any_three),
	    cmocka_unit_test(test_refused_msr_names_it),
	    cmocka_unit_test(test_droppable_values),
	    cmocka_unit_test(test_cpuid_feature_refused),
	    cmocka_unit_test(test_between_box_and_pvm),
	    cmocka_unit_test(test_state_file_cpuid),
	    cmocka_unit_test(test_xsave),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
