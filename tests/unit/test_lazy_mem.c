/* Unit tests of snapshot/lazy_mem.c without KVM: sealed layers fill memfd RAM on first touch. */
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#include "helpers.h"

#include "chain_fixture.h"
#include "snapshot/lazy_mem.h"
#include "vmm/vm.h"

#define RAM_BYTES (FX_PAGES * MEM_LAYER_PAGE)

/*
 * A sealed 3-layer chain, the restore side's key context (a copy of the writer's key that has
 * registered each layer only through snap_crypt_check_layer, as restore does), its open layer set
 * and a VM that is only what lazy_mem touches: a memfd RAM mapping, a logger and the stop state.
 */
struct lazy_fx {
	char dir[64];
	struct chain c;
	struct snap_crypt sc;
	struct layer_set *ls; /* NULL once lazy_mem owns it */
	struct logger log;
	struct vm *vm;
};

static void open_restore_side(struct lazy_fx *f, const struct snap_key *key)
{
	assert_int_equal(crypto_key_import(crypto_key_bytes(key), &f->sc.key), 0);
	assert_int_equal(crypto_ctx_new(f->sc.key, &f->sc.cc), 0);
	memcpy(f->sc.chain_id, f->c.chain_id, 16);
	f->ls = calloc(1, sizeof(*f->ls));
	assert_non_null(f->ls);
	char err[512];
	assert_int_equal(layer_set_open(f->ls, &f->c, f->c.nr_layers - 1, err, sizeof(err)), 0);
}

static void check_layers(struct lazy_fx *f)
{
	for (int i = 0; i < f->ls->nr; i++)
		assert_int_equal(snap_crypt_check_layer(&f->sc, &f->ls->layers[i]), 0);
}

static struct vm *fake_vm(struct logger *log)
{
	struct vm *vm = calloc(1, sizeof(*vm));
	assert_non_null(vm);
	vm->log = log;
	pthread_mutex_init(&vm->lock, NULL);
	pthread_cond_init(&vm->cond, NULL);
	vm->stop_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	assert_true(vm->stop_efd >= 0);
	/* Shared memfd RAM, as guest_mem makes it: userfaultfd then needs MISSING_SHMEM. */
	vm->mem.fd = memfd_create("lazy-ram", MFD_CLOEXEC);
	assert_true(vm->mem.fd >= 0);
	assert_int_equal(ftruncate(vm->mem.fd, RAM_BYTES), 0);
	vm->mem.size = RAM_BYTES;
	vm->mem.host = mmap(NULL, RAM_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, vm->mem.fd, 0);
	assert_true(vm->mem.host != MAP_FAILED);
	return vm;
}

static int setup(void **state)
{
	struct lazy_fx *f = calloc(1, sizeof(*f));
	if (!f)
		return -1;
	struct snap_crypt writer = {0};
	assert_int_equal(crypto_key_generate(&writer.key), 0);
	assert_int_equal(crypto_ctx_new(writer.key, &writer.cc), 0);
	assert_int_equal(crypto_random(writer.chain_id, sizeof(writer.chain_id)), 0);
	fx_mkdtemp(f->dir, sizeof(f->dir), "lazy");
	fx_make_chain_sealed(&f->c, f->dir, 3, &writer);
	open_restore_side(f, writer.key);
	snap_crypt_close(&writer);
	f->log = (struct logger){.level = LOG_ERROR, .out = stderr};
	f->vm = fake_vm(&f->log);
	/* Fault-driven tests count faults: the background prefetch has tests of its own. */
	setenv("COVE_LAZY_PREFETCH", "0", 1);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct lazy_fx *f = *state;
	munmap(f->vm->mem.host, RAM_BYTES);
	close(f->vm->mem.fd);
	close(f->vm->stop_efd);
	pthread_cond_destroy(&f->vm->cond);
	pthread_mutex_destroy(&f->vm->lock);
	free(f->vm);
	if (f->ls) {
		layer_set_close(f->ls);
		free(f->ls);
	}
	snap_crypt_close(&f->sc);
	fx_rmdir(f->dir);
	free(f);
	return 0;
}

/* Flips one byte of DIR/mem-k at `off`. */
static void tamper(const struct lazy_fx *f, int k, uint64_t off)
{
	char path[4200];
	snprintf(path, sizeof(path), "%s/%s", f->dir, f->c.layers[k].mem);
	int fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	uint8_t b;
	assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
	b ^= 0x40;
	assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
	close(fd);
}

/* A byte inside the ciphertext of page p in layer k's file. */
static uint64_t data_off(const struct lazy_fx *f, int k, uint64_t p)
{
	return f->ls->layers[k].info.data_off + p * MEM_LAYER_PAGE + 100;
}

/* A byte inside the tag of page p in layer k's file. */
static uint64_t tag_off(const struct lazy_fx *f, int k, uint64_t p)
{
	return f->ls->layers[k].info.tag_off + p * CRYPTO_TAG_LEN + 3;
}

/*
 * The skip (not an early pass) when this process may not use userfaultfd: root or
 * CAP_SYS_PTRACE, or vm.unprivileged_userfaultfd=1. Probed as lazy_mem_start opens it.
 */
static void skip_without_userfaultfd(void)
{
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (fd >= 0) {
		close(fd);
		return;
	}
	int e = errno;
	char knob[8] = "?";
	FILE *fp = fopen("/proc/sys/vm/unprivileged_userfaultfd", "r");
	if (fp) {
		if (!fgets(knob, sizeof(knob), fp))
			knob[0] = '?';
		knob[strcspn(knob, "\n")] = '\0';
		fclose(fp);
	}
	print_message("skipped: userfaultfd: %s (uid %d, vm.unprivileged_userfaultfd=%s)\n",
		      strerror(e), (int)getuid(), knob);
	skip();
}

static void start(struct lazy_fx *f, struct lazy_mem *lm)
{
	skip_without_userfaultfd();
	char err[512] = "";
	int r = lazy_mem_start(lm, f->vm, f->ls, &f->sc, NULL, err, sizeof(err));
	if (r)
		fail_msg("lazy_mem_start: %d (%s)", r, err);
	f->ls = NULL; /* the lazy thread owns the layers now */
}

/* Every byte of RAM page p (read through the mapping, so a first read faults it in) is v. */
static void assert_page(const struct vm *vm, uint64_t p, uint8_t v)
{
	const uint8_t *pg = vm->mem.host + p * MEM_LAYER_PAGE;
	for (size_t i = 0; i < MEM_LAYER_PAGE; i++)
		if (pg[i] != v)
			fail_msg("RAM page %llu byte %zu is 0x%02x, expected 0x%02x",
				 (unsigned long long)p, i, pg[i], v);
}

static void test_verify_all_good(void **state)
{
	struct lazy_fx *f = *state;
	check_layers(f);
	char err[512] = "";
	assert_int_equal(lazy_mem_verify_all(f->ls, &f->sc, err, sizeof(err)), 0);
	assert_string_equal(err, "");
}

/* The eager check names the first page whose data or tag was altered. */
static void test_verify_all_tampered(void **state)
{
	static const struct {
		int k;
		uint64_t page;
		bool tag;
		const char *needle;
	} cases[] = {
	    {1, 9, false, "page 9 of layer 2"}, /* ciphertext of an increment's page */
	    {0, 5, true, "page 5 of layer 1"},	/* the tag of a base page */
	    {2, 2, true, "page 2 of layer 3"},
	};
	struct lazy_fx *f = *state;
	check_layers(f);
	char err[512];
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint64_t off = cases[i].tag ? tag_off(f, cases[i].k, cases[i].page)
					    : data_off(f, cases[i].k, cases[i].page);
		tamper(f, cases[i].k, off);
		err[0] = '\0';
		assert_int_equal(lazy_mem_verify_all(f->ls, &f->sc, err, sizeof(err)), -EBADMSG);
		assert_one_line_error(err, cases[i].needle);
		assert_non_null(strstr(err, "altered data or tag"));
		tamper(f, cases[i].k, off); /* flipped back: the chain verifies again */
		assert_int_equal(lazy_mem_verify_all(f->ls, &f->sc, err, sizeof(err)), 0);
	}
}

/* Each page is decrypted on its first touch, from the newest layer holding it, and only once. */
static void test_fill_on_first_touch(void **state)
{
	struct lazy_fx *f = *state;
	check_layers(f);
	struct lazy_mem lm;
	start(f, &lm);
	assert_true(lm.started);
	assert_page(f->vm, 9, fx_expect(2, 9)); /* from layer 1 (id 2), not the base */
	for (uint64_t p = 0; p < FX_PAGES; p++)
		assert_page(f->vm, p, fx_expect(2, p));
	for (uint64_t p = 0; p < FX_PAGES; p++) /* second reads: no more faults */
		assert_page(f->vm, p, fx_expect(2, p));
	lazy_mem_stop(&lm); /* joins the thread: its counters are final */
	/* RAM is one window: the first fault filled all of it in one run. */
	assert_int_equal(lm.faults, 1);
	assert_int_equal(lm.pages_filled, FX_PAGES);
	assert_int_equal(lm.zero_pages, 0);
	assert_int_equal(lm.bad_pages, 0);
	assert_false(f->vm->stop_requested);
	assert_null(lm.ls);
	assert_int_equal(lm.uffd, -1);
	lazy_mem_stop(&lm); /* stopping twice is harmless */
}

/* The VmFlags line of the mapping that starts at addr in /proc/self/smaps ("" if none). */
static void vma_flags(const void *addr, char *out, size_t cap)
{
	char line[512], want[32];
	bool in = false;
	FILE *f = fopen("/proc/self/smaps", "r");
	out[0] = '\0';
	assert_non_null(f);
	snprintf(want, sizeof(want), "%lx-", (unsigned long)(uintptr_t)addr);
	while (fgets(line, sizeof(line), f)) {
		if (strchr(line, '-') && strchr(line, ' ') && strchr(line, '-') < strchr(line, ' '))
			in = strncmp(line, want, strlen(want)) == 0;
		else if (in && !strncmp(line, "VmFlags:", 8)) {
			snprintf(out, cap, "%s", line);
			break;
		}
	}
	fclose(f);
}

/*
 * RAM that userfaultfd fills is kept out of transparent huge pages: khugepaged would otherwise
 * collapse a 2 MiB range around one filled page and fill the rest with zeros that no fault
 * ever reports (the restored guests that read zeros where their snapshot had data).
 */
static void test_no_huge_pages_while_lazy(void **state)
{
	struct lazy_fx *f = *state;
	char flags[512];
	check_layers(f);
	struct lazy_mem lm;
	start(f, &lm);
	vma_flags(f->vm->mem.host, flags, sizeof(flags));
	if (!flags[0]) {
		lazy_mem_stop(&lm);
		skip(); /* no smaps entry for it (a kernel without /proc/PID/smaps) */
		return;
	}
	assert_non_null(strstr(flags, " nh"));
	assert_null(strstr(flags, " hg"));
	lazy_mem_stop(&lm);
}

struct toucher {
	const struct vm *vm;
	uint64_t page;
	uint8_t seen_first, seen_last;
};

static void *touch_page(void *arg)
{
	struct toucher *t = arg;
	const volatile uint8_t *pg = t->vm->mem.host + t->page * MEM_LAYER_PAGE;
	t->seen_first = pg[0];
	t->seen_last = pg[MEM_LAYER_PAGE - 1];
	return NULL;
}

/*
 * Several threads (vCPUs, device threads) faulting on one page at once all see the snapshot
 * page: the copy that comes second finds the page there (EEXIST) and is not an error.
 */
static void test_concurrent_touch(void **state)
{
	struct lazy_fx *f = *state;
	check_layers(f);
	struct lazy_mem lm;
	start(f, &lm);
	pthread_t th[4];
	struct toucher t[4];
	for (int i = 0; i < 4; i++) {
		t[i] = (struct toucher){.vm = f->vm, .page = 10};
		assert_int_equal(pthread_create(&th[i], NULL, touch_page, &t[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		assert_int_equal(pthread_join(th[i], NULL), 0);
		assert_int_equal(t[i].seen_first, fx_expect(2, 10));
		assert_int_equal(t[i].seen_last, fx_expect(2, 10));
	}
	lazy_mem_stop(&lm);
	assert_in_range(lm.faults, 1, 4);
	assert_int_equal(lm.zero_pages, 0);
	assert_int_equal(lm.bad_pages, 0);
	assert_false(f->vm->stop_requested);
}

/* A first write gets the snapshot page first, then lands on it. */
static void test_write_first_touch(void **state)
{
	struct lazy_fx *f = *state;
	check_layers(f);
	struct lazy_mem lm;
	start(f, &lm);
	uint8_t *pg = f->vm->mem.host + 3 * MEM_LAYER_PAGE;
	pg[0] = 0x5a;
	assert_int_equal(pg[0], 0x5a);
	assert_int_equal(pg[1], fx_expect(2, 3));
	assert_int_equal(pg[MEM_LAYER_PAGE - 1], fx_expect(2, 3));
	/* The memfd, which a snapshot of the restored VM reads, holds the same bytes. */
	uint8_t b;
	assert_int_equal(pread(f->vm->mem.fd, &b, 1, 3 * MEM_LAYER_PAGE + 1), 1);
	assert_int_equal(b, fx_expect(2, 3));
	lazy_mem_stop(&lm);
	assert_int_equal(lm.faults, 1);
}

/*
 * A page that fails authentication never reaches RAM: the faulting thread gets a zero page, the
 * VM is asked to stop with a message naming page and layer, and other pages still serve.
 */
/* RAM pages resident (filled) now, by mincore: it looks without faulting anything in. */
static uint64_t resident(const struct vm *vm, bool *which)
{
	unsigned char v[FX_PAGES];
	assert_int_equal(mincore(vm->mem.host, RAM_BYTES, v), 0);
	uint64_t n = 0;
	for (int i = 0; i < FX_PAGES; i++) {
		which[i] = v[i] & 1;
		n += v[i] & 1;
	}
	return n;
}

/* Waits up to 5 s until `want` pages are resident. */
static void wait_resident(const struct vm *vm, uint64_t want, bool *which)
{
	for (int i = 0; i < 500 && resident(vm, which) < want; i++)
		usleep(10000);
	assert_int_equal(resident(vm, which), want);
}

/* With nothing touching RAM, the prefetch fills every page with data, each from its layer. */
static void test_prefetch_fills_untouched(void **state)
{
	struct lazy_fx *f = *state;
	check_layers(f);
	setenv("COVE_LAZY_PREFETCH", "1", 1);
	struct lazy_mem lm;
	start(f, &lm);
	assert_true(lm.prefetch);
	assert_true(lm.ahead_started);
	bool which[FX_PAGES];
	wait_resident(f->vm, FX_PAGES, which);
	lazy_mem_stop(&lm);
	assert_int_equal(lm.faults, 0);
	assert_int_equal(lm.pages_prefetched, FX_PAGES);
	for (uint64_t p = 0; p < FX_PAGES; p++)
		assert_page(f->vm, p, fx_expect(2, p));
	assert_false(f->vm->stop_requested);
}

/*
 * The same with the userfaultfd thread opening every page itself (COVE_LAZY_AHEAD=0), and with
 * the helper (the default): both fill every page from its layer, and a fault far ahead of the
 * helper is served at once.
 */
static void test_ahead_and_in_thread_agree(void **state)
{
	struct lazy_fx *f = *state;
	check_layers(f);
	setenv("COVE_LAZY_PREFETCH", "1", 1);
	setenv("COVE_LAZY_AHEAD", "0", 1);
	struct lazy_mem lm;
	start(f, &lm);
	assert_false(lm.ahead_started);
	bool which[FX_PAGES];
	wait_resident(f->vm, FX_PAGES, which);
	lazy_mem_stop(&lm);
	unsetenv("COVE_LAZY_AHEAD");
	assert_int_equal(lm.pages_prefetched, FX_PAGES);
	for (uint64_t p = 0; p < FX_PAGES; p++)
		assert_page(f->vm, p, fx_expect(2, p));
	assert_false(f->vm->stop_requested);
}

static void test_ahead_fault_far_ahead(void **state)
{
	struct lazy_fx *f = *state;
	check_layers(f);
	setenv("COVE_LAZY_PREFETCH", "1", 1);
	struct lazy_mem lm;
	start(f, &lm);
	assert_true(lm.ahead_started);
	assert_page(f->vm, FX_PAGES - 1, fx_expect(2, FX_PAGES - 1));
	bool which[FX_PAGES];
	wait_resident(f->vm, FX_PAGES, which);
	lazy_mem_stop(&lm);
	assert_true(lm.pages_prefetched + lm.pages_filled == FX_PAGES);
	for (uint64_t p = 0; p < FX_PAGES; p++)
		assert_page(f->vm, p, fx_expect(2, p));
	assert_false(f->vm->stop_requested);
}

/* By default nothing is prefetched before the guest's first fault (the restore is not slowed). */
static void test_prefetch_waits_for_first_fault(void **state)
{
	struct lazy_fx *f = *state;
	check_layers(f);
	unsetenv("COVE_LAZY_PREFETCH");
	struct lazy_mem lm;
	start(f, &lm);
	assert_false(lm.prefetch_now);
	bool which[FX_PAGES];
	usleep(100000);
	assert_int_equal(resident(f->vm, which), 0);
	assert_page(f->vm, 1, fx_expect(2, 1));
	lazy_mem_stop(&lm);
	assert_int_equal(lm.faults, 1);
}

/* A page that fails authentication is never prefetched: it stays missing for its own fault. */
static void test_prefetch_skips_tampered(void **state)
{
	struct lazy_fx *f = *state;
	check_layers(f);
	tamper(f, 2, tag_off(f, 2, 2));
	setenv("COVE_LAZY_PREFETCH", "1", 1);
	struct lazy_mem lm;
	start(f, &lm);
	bool which[FX_PAGES];
	wait_resident(f->vm, FX_PAGES - 1, which);
	assert_false(which[2]);
	usleep(50000); /* it does not come back for it */
	assert_int_equal(resident(f->vm, which), FX_PAGES - 1);
	assert_page(f->vm, 2, 0); /* its fault: zero page, VM stopped */
	lazy_mem_stop(&lm);
	assert_int_equal(lm.pages_prefetched, FX_PAGES - 1);
	assert_int_equal(lm.bad_pages, 1);
	assert_int_equal(lm.faults, 1);
	assert_true(f->vm->stop_requested);
	assert_one_line_error(f->vm->exit.reason, "page 2 of layer 3 failed authentication");
}

static void test_tampered_page_refused(void **state)
{
	struct lazy_fx *f = *state;
	check_layers(f);
	tamper(f, 2, data_off(f, 2, 2));
	struct lazy_mem lm;
	start(f, &lm);
	assert_page(f->vm, 2, 0);
	assert_page(f->vm, 4, fx_expect(2, 4));
	lazy_mem_stop(&lm);
	assert_int_equal(lm.bad_pages, 1);
	assert_int_equal(lm.zero_pages, 1);
	assert_int_equal(lm.faults, 2);
	assert_true(f->vm->stop_requested);
	assert_int_equal(f->vm->exit.status, 1);
	assert_one_line_error(f->vm->exit.reason, "page 2 of layer 3 failed authentication");
	assert_non_null(strstr(f->vm->exit.reason, "altered data or tag"));
	assert_non_null(strstr(f->vm->exit.reason, "never saw it"));
	uint64_t n = 0;
	assert_int_equal(read(f->vm->stop_efd, &n, sizeof(n)), (ssize_t)sizeof(n));
	assert_int_equal(n, 1); /* the event loop was woken to stop */
}

/* Layers never checked against their sealed digest have no subkey: their pages are refused. */
static void test_unchecked_layers_refused(void **state)
{
	struct lazy_fx *f = *state;
	struct lazy_mem lm;
	start(f, &lm);
	assert_page(f->vm, 0, 0);
	lazy_mem_stop(&lm);
	assert_int_equal(lm.bad_pages, 1);
	assert_true(f->vm->stop_requested);
	assert_one_line_error(f->vm->exit.reason, "page 0 of layer 1 failed authentication");
	assert_non_null(strstr(f->vm->exit.reason, strerror(ENOKEY)));
}

/* A start that fails leaves the layers with the caller and the lazy_mem stopped. */
static void test_start_fails_on_unmapped_ram(void **state)
{
	struct lazy_fx *f = *state;
	skip_without_userfaultfd();
	check_layers(f);
	uint8_t *host = f->vm->mem.host;
	/* RAM not page aligned: UFFDIO_REGISTER refuses it. */
	f->vm->mem.host = host + 1;
	struct lazy_mem lm;
	char err[512] = "";
	assert_int_equal(lazy_mem_start(&lm, f->vm, f->ls, &f->sc, NULL, err, sizeof(err)),
			 -EINVAL);
	f->vm->mem.host = host;
	assert_one_line_error(err, "UFFDIO_REGISTER of guest RAM");
	assert_false(lm.started);
	assert_null(lm.ls);
	assert_null(lm.cc);
	assert_int_equal(lm.uffd, -1);
	assert_int_equal(lm.stop_efd, -1);
	lazy_mem_stop(&lm);
	/* The caller still owns an open layer set (teardown closes it). */
	assert_int_equal(f->ls->nr, 3);
	assert_true(f->ls->layers[0].fd >= 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_verify_all_good, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_verify_all_tampered, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_no_huge_pages_while_lazy, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_fill_on_first_touch, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_write_first_touch, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_concurrent_touch, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_tampered_page_refused, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_prefetch_fills_untouched, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_prefetch_skips_tampered, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_prefetch_waits_for_first_fault, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_ahead_and_in_thread_agree, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_ahead_fault_far_ahead, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_unchecked_layers_refused, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_start_fails_on_unmapped_ram, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
