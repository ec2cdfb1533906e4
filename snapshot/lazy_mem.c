/* Lazy restore of encrypted layers: a userfaultfd thread decrypts pages the first time anything
 * touches them, with each fault a run of neighbours in one UFFDIO_COPY. */
#include "snapshot/lazy_mem.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/file_io.h"
#include "common/errmsg.h"
#include "snapshot/lazy_ahead.h"
#include "vmm/vm.h"

/* Reads page p of layer l (ciphertext and tag) and authenticates it into `plain`. */
static int open_page(struct crypto_ctx *cc, const uint8_t chain_id[16], const struct mem_layer *l,
		     uint64_t p, uint8_t *cipher, uint8_t *plain)
{
	uint8_t tag[16];
	int r = pread_full(l->fd, cipher, MEM_LAYER_PAGE,
			   (off_t)(l->info.data_off + p * MEM_LAYER_PAGE));
	if (!r)
		r = pread_full(l->fd, tag, sizeof(tag), (off_t)(l->info.tag_off + p * 16));
	if (!r)
		r = crypto_open_page(cc, chain_id, l->info.layer_id, p, cipher, MEM_LAYER_PAGE,
				     plain, tag);
	return r;
}

static void set_filled(struct lazy_mem *lm, uint64_t first, uint64_t n)
{
	for (uint64_t p = first; p < first + n; p++)
		lm->filled[p / 64] |= 1ULL << (p % 64);
}

static bool is_filled(const struct lazy_mem *lm, uint64_t p)
{
	return lm->filled[p / 64] >> (p % 64) & 1;
}

/*
 * UFFDIO_COPY of pages [first, first + n) from src + off pages. A page already there (a fault
 * queued twice) is skipped, and the thread that faulted on it woken.
 */
static void copy_from(struct lazy_mem *lm, const uint8_t *src, uint64_t first, uint64_t n,
		      uint64_t off)
{
	struct guest_mem *m = &lm->vm->mem;
	uint64_t done = 0;
	while (done < n) {
		uint64_t addr = (uint64_t)(uintptr_t)m->host + (first + done) * MEM_LAYER_PAGE;
		struct uffdio_copy c = {
		    .dst = addr,
		    .src = (uint64_t)(uintptr_t)(src + (off + done) * MEM_LAYER_PAGE),
		    .len = (n - done) * MEM_LAYER_PAGE};
		if (ioctl(lm->uffd, UFFDIO_COPY, &c) == 0) {
			done = n;
			break;
		}
		int e = errno;
		uint64_t got = c.copy > 0 ? (uint64_t)c.copy / MEM_LAYER_PAGE : 0;
		done += got;
		if (e == EAGAIN && got)
			continue;
		if (e == EEXIST) { /* this page is there: wake whoever waits for it, go on */
			struct uffdio_range w = {.start = addr + got * MEM_LAYER_PAGE,
						 .len = MEM_LAYER_PAGE};
			(void)ioctl(lm->uffd, UFFDIO_WAKE, &w);
			done++;
			continue;
		}
		log_err(lm->vm->log, "lazy restore: UFFDIO_COPY of pages %llu..%llu: %s",
			(unsigned long long)(first + done), (unsigned long long)(first + n - 1),
			strerror(e));
		return;
	}
}

static void copy_run(struct lazy_mem *lm, uint64_t first, uint64_t n, uint64_t off)
{
	copy_from(lm, lm->plain, first, n, off);
}

/* Copies the runs the helper opened, each page not filled meanwhile. */
static void drain_ahead(struct lazy_mem *lm)
{
	const struct ahead_run *r;
	while (lm->ahead && !lm->ahead_done && (r = lazy_ahead_peek(lm->ahead))) {
		uint64_t i = 0;
		while (i < r->good) {
			if (is_filled(lm, r->first + i)) {
				i++;
				continue;
			}
			uint64_t j = i + 1;
			while (j < r->good && !is_filled(lm, r->first + j))
				j++;
			copy_from(lm, r->plain, r->first + i, j - i, i);
			set_filled(lm, r->first + i, j - i);
			lm->pages_prefetched += j - i;
			i = j;
		}
		lazy_ahead_pop(lm->ahead);
	}
	/* Freed by lazy_mem_stop: this thread's filter lets it free no key (munlock). */
	if (lm->ahead && lazy_ahead_done(lm->ahead))
		lm->ahead_done = true;
}

/* Serves one missing page and the run of neighbours lazy_window_pick gives with it. */
static void serve(struct lazy_mem *lm, uint64_t addr)
{
	struct guest_mem *m = &lm->vm->mem;
	uint64_t page_addr = addr & ~(MEM_LAYER_PAGE - 1);
	uint64_t p = (page_addr - (uint64_t)(uintptr_t)m->host) / MEM_LAYER_PAGE;
	lm->faults++;
	if (p >= lm->nr_pages)
		return;
	if (lm->ahead && !lm->ahead_done) {
		/* The helper may have opened it already: its copy wakes the faulting thread. */
		drain_ahead(lm);
		if (is_filled(lm, p)) {
			struct uffdio_range w = {.start = page_addr, .len = MEM_LAYER_PAGE};
			(void)ioctl(lm->uffd, UFFDIO_WAKE, &w);
			return;
		}
	}
	uint64_t first, n;
	lazy_window_pick(lm->filled, lm->nr_pages, lm->ls, p, &lm->ra, &first, &n);
	const struct mem_layer *src = lazy_source(lm->ls, p);
	if (src && mem_layer_stored(src, p)) {
		struct lazy_src ls = {lm->cc, lm->chain_id, lm->ls, lm->gate, true};
		lazy_open_run(&ls, first, n, lm->plain, lm->tags, lm->res);
		int r = lm->res[p - first];
		if (r == 0) {
			/* The run around p without neighbours that failed: they wait for their
			 * fault. */
			uint64_t a = p, b = p + 1;
			while (a > first && lm->res[a - 1 - first] == 0)
				a--;
			while (b < first + n && lm->res[b - first] == 0)
				b++;
			copy_run(lm, a, b - a, a - first);
			set_filled(lm, a, b - a);
			lm->pages_filled += b - a;
			return;
		}
		lm->bad_pages++;
		if (lm->gate && r != -EBADMSG)
			vm_request_stop(
			    lm->vm, 1,
			    "snapshot page %llu of layer %llu could not be fetched from "
			    "the store (%s): the guest was stopped and never saw it",
			    (unsigned long long)p, (unsigned long long)src->info.layer_id,
			    lazy_gate_strerror(r));
		else
			vm_request_stop(
			    lm->vm, 1,
			    "snapshot page %llu of layer %llu failed authentication (%s): "
			    "the guest was stopped and never saw it",
			    (unsigned long long)p, (unsigned long long)src->info.layer_id,
			    r == -EBADMSG ? "altered data or tag" : strerror(-r));
		/*
		 * The stop request has kicked the vCPUs; the zero page below only unblocks the
		 * faulting thread, which then leaves KVM_RUN without entering the guest again.
		 */
	}
	lm->zero_pages++;
	set_filled(lm, p, 1);
	struct uffdio_zeropage z = {.range = {.start = page_addr, .len = MEM_LAYER_PAGE}};
	if (ioctl(lm->uffd, UFFDIO_ZEROPAGE, &z) < 0) {
		if (errno == EEXIST) {
			struct uffdio_range w = {.start = page_addr, .len = MEM_LAYER_PAGE};
			(void)ioctl(lm->uffd, UFFDIO_WAKE, &w);
		} else {
			log_err(lm->vm->log, "lazy restore: UFFDIO_ZEROPAGE of page %llu: %s",
				(unsigned long long)p, strerror(errno));
		}
	}
}

/* One prefetch run (no fault waits): false when every page with data is filled. */
static bool prefetch_step(struct lazy_mem *lm)
{
	uint64_t first, n;
	if (!lazy_next_run(lm->filled, lm->nr_pages, lm->ls, lm->prefetch_next, LAZY_WIN_MIN * 4,
			   &first, &n))
		return false;
	struct lazy_src ls = {lm->cc, lm->chain_id, lm->ls, lm->gate, false};
	lazy_open_run(&ls, first, n, lm->plain, lm->tags, lm->res);
	uint64_t good = 0;
	while (good < n && lm->res[good] == 0)
		good++;
	if (good < n && lm->res[good] == -EAGAIN) {
		/* Not fetched yet: fill what is there, look again once more has arrived. */
		if (good) {
			copy_run(lm, first, good, 0);
			set_filled(lm, first, good);
			lm->pages_prefetched += good;
		}
		lm->prefetch_next = first + good;
		lm->prefetch_blocked = true;
		return true;
	}
	if (good) {
		copy_run(lm, first, good, 0);
		set_filled(lm, first, good);
		lm->pages_prefetched += good;
	}
	/* A page that failed stays missing: its fault, if one comes, stops the VM. */
	lm->prefetch_next = first + (good < n ? good + 1 : n);
	return true;
}

static void *lazy_thread(void *arg)
{
	struct lazy_mem *lm = arg;
	struct pollfd pf[3] = {{lm->uffd, POLLIN, 0}, {lm->stop_efd, POLLIN, 0}, {-1, POLLIN, 0}};
	pthread_setname_np(pthread_self(), "cove-uffd");
	/* The sandbox's per-thread set-up (its seccomp filter) before the first fault is served. */
	int hr = vm_thread_enter(lm->vm, VM_THREAD_UFFD);
	if (hr) {
		vm_request_stop(lm->vm, 1, "userfaultfd thread: set-up failed: %s", strerror(-hr));
		return NULL;
	}
	/* With the helper opening ahead, this thread only copies what it opened. */
	bool prefetching = lm->prefetch && !lm->ahead;
	for (;;) {
		bool now = prefetching && (lm->prefetch_now || lm->faults);
		/* Its runs are copied from the guest's first fault on, as the prefetch would be;
		 * until then the helper opens only as many as it has buffers for. */
		pf[2].fd = lm->ahead && !lm->ahead_done && (lm->prefetch_now || lm->faults)
			       ? lazy_ahead_fd(lm->ahead)
			       : -1;
		int pr = poll(pf, 3, now ? (lm->prefetch_blocked ? 20 : 0) : -1);
		lm->prefetch_blocked = false;
		if (pr < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (pr == 0) { /* nothing waits: prefetch a run, then look again */
			prefetching = prefetch_step(lm);
			continue;
		}
		if (pf[1].revents)
			break;
		if (pf[2].fd >= 0 && pf[2].revents)
			drain_ahead(lm);
		if (!pf[0].revents)
			continue;
		struct uffd_msg msg[16];
		ssize_t n = read(lm->uffd, msg, sizeof(msg));
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				continue;
			break;
		}
		for (size_t i = 0; i < (size_t)n / sizeof(msg[0]); i++)
			if (msg[i].event == UFFD_EVENT_PAGEFAULT)
				serve(lm, msg[i].arg.pagefault.address);
	}
	return NULL;
}

/*
 * A userfaultfd that takes the kernel's faults too (KVM touches guest RAM from the kernel). The
 * system call needs CAP_SYS_PTRACE for those unless vm.unprivileged_userfaultfd is 1; a process
 * without it (a jailed VMM) may still use /dev/userfaultfd (Linux 6.1+), whose file mode decides.
 * The fd, or -errno (the system call's).
 */
static int open_uffd(void)
{
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (fd >= 0 || errno != EPERM)
		return fd >= 0 ? fd : -errno;
	int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	if (dev < 0)
		return -EPERM;
	fd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
	close(dev);
	return fd >= 0 ? fd : -EPERM;
}

int lazy_mem_start(struct lazy_mem *lm, struct vm *vm, struct layer_set *ls,
		   const struct snap_crypt *sc, struct lazy_gate *gate, char *err, size_t errlen)
{
	memset(lm, 0, sizeof(*lm));
	lm->vm = vm;
	lm->uffd = lm->stop_efd = -1;
	lm->gate = gate;
	int r = 0;
	if (sc) {
		memcpy(lm->chain_id, sc->chain_id, 16);
		r = crypto_ctx_dup(sc->cc, &lm->cc); /* with the layers plan_load registered */
	}
	if (r) {
		lazy_mem_stop(lm);
		return errmsg(err, errlen, r, "cannot set up AES-GCM: %s", strerror(-r));
	}
	lm->nr_pages = vm->mem.size / MEM_LAYER_PAGE;
	/*
	 * Prefetch: "1" from the start, "0" never; by default once the guest runs (its first fault)
	 * and only with more than one CPU (on one it would only take time from the vCPU).
	 */
	const char *pf = getenv("COVE_LAZY_PREFETCH");
	lm->prefetch = pf ? strcmp(pf, "0") != 0 : sysconf(_SC_NPROCESSORS_ONLN) > 1;
	lm->prefetch_now = pf && !strcmp(pf, "1");
	/* The largest run a fault fills (benchmarks: 1 is the page-by-page restore of before). */
	const char *win = getenv("COVE_LAZY_WINDOW");
	lm->ra.max = win ? (uint32_t)strtoul(win, NULL, 10) : 0;
	lm->plain = aligned_alloc(MEM_LAYER_PAGE, LAZY_WIN_MAX * MEM_LAYER_PAGE);
	lm->tags = malloc(LAZY_WIN_MAX * CRYPTO_TAG_LEN);
	lm->res = calloc(LAZY_WIN_MAX, sizeof(*lm->res));
	lm->filled = calloc((size_t)((lm->nr_pages + 63) / 64) + 1, sizeof(*lm->filled));
	if (!lm->plain || !lm->tags || !lm->res || !lm->filled) {
		r = -ENOMEM;
		goto fail;
	}
	lm->uffd = open_uffd();
	if (lm->uffd < 0) {
		r = errmsg(err, errlen, lm->uffd,
			   "userfaultfd: %s (lazy restore needs it; without "
			   "CAP_SYS_PTRACE, as in a jail, give access to /dev/userfaultfd or set "
			   "vm.unprivileged_userfaultfd=1)",
			   strerror(-lm->uffd));
		goto fail;
	}
	struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_MISSING_SHMEM};
	if (ioctl(lm->uffd, UFFDIO_API, &api) < 0) {
		r = errmsg(err, errlen, -errno, "UFFDIO_API: %s", strerror(errno));
		goto fail;
	}
	/*
	 * No transparent huge pages on RAM that userfaultfd fills. khugepaged collapses a 2 MiB
	 * range of a shmem file that has one page present into a huge page, filling the other
	 * 511 with zeros, and no missing-page fault ever comes for them (older kernels did
	 * this with userfaultfd armed too). The guest then reads zeros where its snapshot had
	 * data: seen as restored guests that oopsed on all-zero kernel text and on a zeroed
	 * files_struct, a few restores in a hundred, in the KVM box (shmem_enabled=advise).
	 */
	(void)madvise(vm->mem.host, vm->mem.size, MADV_NOHUGEPAGE); /* EINVAL: no THP at all */
	struct uffdio_register reg = {
	    .range = {.start = (uint64_t)(uintptr_t)vm->mem.host, .len = vm->mem.size},
	    .mode = UFFDIO_REGISTER_MODE_MISSING,
	};
	if (ioctl(lm->uffd, UFFDIO_REGISTER, &reg) < 0) {
		r = errmsg(err, errlen, -errno, "UFFDIO_REGISTER of guest RAM: %s",
			   strerror(errno));
		goto fail;
	}
	lm->stop_efd = eventfd(0, EFD_CLOEXEC);
	if (lm->stop_efd < 0) {
		r = -errno;
		goto fail;
	}
	lm->ls = ls;
	/* Decrypt ahead of the guest where a second core can (and the whole chain is here). */
	const char *ah = getenv("COVE_LAZY_AHEAD");
	if (lm->cc && !gate && lm->prefetch && !(ah && !strcmp(ah, "0"))) {
		int ar = lazy_ahead_start(&lm->ahead, vm, ls, lm->cc, lm->chain_id, lm->nr_pages);
		lm->ahead_started = ar == 0;
		if (ar)
			log_warn(vm->log,
				 "lazy restore: no helper to decrypt ahead (%s): the "
				 "userfaultfd thread opens every page itself",
				 strerror(-ar));
	}
	r = -pthread_create(&lm->thread, NULL, lazy_thread, lm);
	if (r) {
		lm->ls = NULL;
		errmsg(err, errlen, r, "cannot start the lazy restore thread");
		goto fail;
	}
	lm->started = true;
	return 0;
fail:
	lazy_mem_stop(lm);
	return r;
}

void lazy_mem_stop(struct lazy_mem *lm)
{
	if (lm->started) {
		uint64_t one = 1;
		if (write(lm->stop_efd, &one, sizeof(one)) < 0) {
			/* The thread then ends with the process. */
		}
		pthread_join(lm->thread, NULL);
		lm->started = false;
	}
	lazy_ahead_stop(lm->ahead);
	lm->ahead = NULL;
	if (lm->uffd >= 0)
		close(lm->uffd);
	if (lm->stop_efd >= 0)
		close(lm->stop_efd);
	lm->uffd = lm->stop_efd = -1;
	if (lm->cc)
		crypto_ctx_free(lm->cc);
	lm->cc = NULL;
	lazy_gate_free(lm->gate);
	lm->gate = NULL;
	free(lm->plain);
	free(lm->tags);
	free(lm->res);
	free(lm->filled);
	lm->plain = lm->tags = NULL;
	lm->res = NULL;
	lm->filled = NULL;
	if (lm->ls) {
		layer_set_close(lm->ls);
		free(lm->ls);
		lm->ls = NULL;
	}
}

int lazy_mem_verify_all(const struct layer_set *ls, const struct snap_crypt *sc, char *err,
			size_t errlen)
{
	uint8_t *cipher = aligned_alloc(MEM_LAYER_PAGE, MEM_LAYER_PAGE);
	uint8_t *plain = aligned_alloc(MEM_LAYER_PAGE, MEM_LAYER_PAGE);
	int r = cipher && plain ? 0 : -ENOMEM;
	for (int i = 0; i < ls->nr && !r; i++) {
		const struct mem_layer *l = &ls->layers[i];
		for (uint64_t p = 0; p < l->info.nr_pages && !r; p++) {
			if (p % 64 == 0 && !l->stored[p / 64]) {
				p += 63;
				continue;
			}
			if (!mem_layer_stored(l, p))
				continue;
			r = open_page(sc->cc, sc->chain_id, l, p, cipher, plain);
			if (r)
				errmsg(err, errlen, r,
				       "snapshot page %llu of layer %llu failed authentication: %s",
				       (unsigned long long)p, (unsigned long long)l->info.layer_id,
				       r == -EBADMSG ? "altered data or tag" : strerror(-r));
		}
	}
	free(cipher);
	free(plain);
	return r;
}
