/* Host micro-benchmark of lazy restore (no KVM): a sealed layer of a 4 GiB guest holding MIB MiB
 * of random pages (from 16 MiB up, as the stamper writes them) restored through
 * snapshot/lazy_mem.c into a fresh memfd RAM, then one thread touches each of those pages once,
 * in order (what the stamper's next round does), timed from lazy_mem_start to the last touch.
 * Beside it: the same pages read from the plain layer file mapped privately (what a plain
 * restore does). Variants, interleaved: page by page (COVE_LAZY_WINDOW=1, the restore before
 * runs), runs without prefetch, runs with the prefetch on the userfaultfd thread
 * (COVE_LAZY_AHEAD=0, before issue 36), runs with a helper decrypting ahead (the default).
 * JSON on stdout.
 * Usage: lazy_restore_bench DIR [MIB [RUNS]] */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/crc32.h"
#include "common/file_io.h"
#include "snapshot/lazy_mem.h"
#include "snapshot/snap_crypt.h"
#include "vmm/vm.h"

#define PAGE  4096ULL
#define RAM   (4ULL << 30)
#define FIRST ((16ULL << 20) / PAGE)
#define V     5 /* variants: plain and four lazy restores */

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static int die(const char *what, int r)
{
	fprintf(stderr, "lazy_restore_bench: %s: %s\n", what, strerror(r < 0 ? -r : r));
	exit(1);
}

/* DIR/mem-0 (sealed with sc, or plain) holding pages [FIRST, FIRST + n) of `data`. */
static void write_layer(const char *dir, struct snap_crypt *sc, const uint8_t *data, uint64_t n,
			struct chain *c)
{
	struct mem_layer_info li;
	memset(&li, 0, sizeof(li));
	li.flags = MEM_LAYER_FULL | (sc ? MEM_LAYER_ENCRYPTED : 0);
	mem_layer_layout(&li, RAM);
	li.layer_id = 1;
	memcpy(li.chain_id, c->chain_id, 16);
	size_t bms = (size_t)li.bitmap_len * (sc ? 2 : 1);
	uint8_t *bm = calloc(1, bms), *pg = aligned_alloc(PAGE, PAGE), tag[16];
	uint8_t *hdr = calloc(1, MEM_LAYER_HDR);
	if (!bm || !pg || !hdr)
		die("memory", ENOMEM);
	if (sc && snap_crypt_new_layer(sc, 1, li.salt))
		die("new layer", EIO);
	char path[4200];
	snprintf(path, sizeof(path), "%s/%s", dir, c->layers[0].mem);
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		die(path, errno);
	for (uint64_t i = 0; i < n; i++) {
		uint64_t p = FIRST + i;
		bm[p / 8] |= (uint8_t)(1u << (p % 8));
		if (sc)
			bm[li.bitmap_len + p / 8] |= (uint8_t)(1u << (p % 8));
		memcpy(pg, data + i * PAGE, PAGE);
		if (sc) {
			if (crypto_seal_page(sc->cc, c->chain_id, 1, p, pg, PAGE, pg, tag) ||
			    pwrite_full(fd, tag, 16, (off_t)(li.tag_off + p * 16)))
				die("seal", EIO);
		}
		if (pwrite_full(fd, pg, PAGE, (off_t)(li.data_off + p * PAGE)))
			die("write", EIO);
	}
	li.present = li.stored = n;
	li.bitmap_crc = crc32_update(0, bm, bms);
	mem_layer_header_build(&li, hdr);
	if (sc) {
		if (snap_crypt_seal_meta(sc, hdr, bm, bms, li.meta))
			die("meta", EIO);
		mem_layer_header_build(&li, hdr);
	}
	if (pwrite_full(fd, hdr, MEM_LAYER_HDR, 0) ||
	    pwrite_full(fd, bm, bms, (off_t)li.bitmap_off) ||
	    ftruncate(fd, (off_t)mem_layer_file_size(&li)) || fsync(fd))
		die("write", EIO);
	close(fd);
	c->layers[0].present = c->layers[0].stored = n;
	free(bm);
	free(pg);
	free(hdr);
}

static struct vm *fresh_vm(struct logger *log)
{
	struct vm *vm = calloc(1, sizeof(*vm));
	if (!vm)
		die("memory", ENOMEM);
	vm->log = log;
	pthread_mutex_init(&vm->lock, NULL);
	pthread_cond_init(&vm->cond, NULL);
	vm->stop_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	vm->mem.fd = memfd_create("bench-ram", MFD_CLOEXEC);
	if (vm->mem.fd < 0 || ftruncate(vm->mem.fd, (off_t)RAM))
		die("memfd", errno);
	vm->mem.size = RAM;
	vm->mem.host = mmap(NULL, RAM, PROT_READ | PROT_WRITE, MAP_SHARED, vm->mem.fd, 0);
	if (vm->mem.host == MAP_FAILED)
		die("mmap", errno);
	return vm;
}

static void free_vm(struct vm *vm)
{
	munmap(vm->mem.host, RAM);
	close(vm->mem.fd);
	close(vm->stop_efd);
	free(vm);
}

/* Touches pages [FIRST, FIRST + n) of `ram` once each; returns a checksum (keeps the reads). */
static uint64_t touch(const uint8_t *ram, uint64_t n)
{
	uint64_t sum = 0;
	for (uint64_t i = 0; i < n; i++)
		sum += ((const volatile uint64_t *)(ram + (FIRST + i) * PAGE))[7];
	return sum;
}

/* One encrypted restore with COVE_LAZY_WINDOW=win and COVE_LAZY_PREFETCH=pf, in ms. */
static double lazy_once(struct chain *c, struct snap_crypt *sc, struct logger *log, uint64_t n,
			const char *win, const char *pf, const char *ahead, uint64_t want,
			uint64_t *faults)
{
	setenv("COVE_LAZY_WINDOW", win, 1);
	setenv("COVE_LAZY_PREFETCH", pf, 1);
	setenv("COVE_LAZY_AHEAD", ahead, 1);
	struct vm *vm = fresh_vm(log);
	struct layer_set *ls = calloc(1, sizeof(*ls));
	char err[512];
	double t0 = now();
	if (!ls || layer_set_open(ls, c, 0, err, sizeof(err)) ||
	    snap_crypt_check_layer(sc, &ls->layers[0]))
		die("open layer", EIO);
	struct lazy_mem lm;
	if (lazy_mem_start(&lm, vm, ls, sc, NULL, err, sizeof(err)))
		die(err, EIO);
	uint64_t sum = touch(vm->mem.host, n);
	double t = (now() - t0) * 1e3;
	lazy_mem_stop(&lm);
	if (sum != want || vm->stop_requested)
		die("restored data differs", EBADMSG);
	*faults = lm.faults;
	free_vm(vm);
	return t;
}

static double plain_once(const char *dir, uint64_t n, uint64_t want)
{
	char path[4200];
	snprintf(path, sizeof(path), "%s/plain/mem-0", dir);
	double t0 = now();
	struct mem_layer l;
	char err[512];
	if (mem_layer_open(&l, path, err, sizeof(err)))
		die(err, EIO);
	uint8_t *ram =
	    mmap(NULL, RAM, PROT_READ | PROT_WRITE, MAP_PRIVATE, l.fd, (off_t)l.info.data_off);
	if (ram == MAP_FAILED)
		die("mmap", errno);
	uint64_t sum = touch(ram, n);
	double t = (now() - t0) * 1e3;
	munmap(ram, RAM);
	mem_layer_close(&l);
	if (sum != want)
		die("plain data differs", EBADMSG);
	return t;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: lazy_restore_bench DIR [MIB [RUNS]]\n");
		return 2;
	}
	const char *dir = argv[1];
	unsigned mib = argc > 2 ? (unsigned)atoi(argv[2]) : 40;
	int runs = argc > 3 ? atoi(argv[3]) : 9;
	if (!mib || mib > 1024 || runs < 1 || runs > 99)
		return 2;
	uint64_t n = (uint64_t)mib * 256;
	uint8_t *data = malloc(n * PAGE);
	struct snap_crypt sc = {0};
	if (!data || crypto_random(data, n * PAGE) || crypto_key_generate(&sc.key) ||
	    crypto_ctx_new(sc.key, &sc.cc) || crypto_random(sc.chain_id, 16))
		die("setup", EIO);
	uint64_t want = 0;
	for (uint64_t i = 0; i < n; i++)
		want += ((const uint64_t *)(data + i * PAGE))[7];
	char edir[2048], pdir[2048];
	snprintf(edir, sizeof(edir), "%s/enc", dir);
	snprintf(pdir, sizeof(pdir), "%s/plain", dir);
	if ((mkdir(edir, 0700) && errno != EEXIST) || (mkdir(pdir, 0700) && errno != EEXIST))
		die("mkdir", errno);
	struct chain ce = {0}, cp = {0};
	for (struct chain *c = &ce; c; c = c == &ce ? &cp : NULL) {
		snprintf(c->dir, sizeof(c->dir), "%s", c == &ce ? edir : pdir);
		memcpy(c->chain_id, sc.chain_id, 16);
		c->ram_size = RAM;
		c->nr_layers = 1;
		c->layers[0].id = 1;
		c->layers[0].full = true;
		snprintf(c->layers[0].mem, sizeof(c->layers[0].mem), "mem-0");
	}
	write_layer(edir, &sc, data, n, &ce);
	write_layer(pdir, NULL, data, n, &cp);
	struct logger log = {.level = LOG_ERROR, .out = stderr};
	static const char *names[V] = {"plain", "enc_page_by_page", "enc_runs",
				       "enc_runs_prefetch_in_thread", "enc_runs_prefetch"};
	static const char *win[V] = {"", "1", "0", "0", "0"}, *pf[V] = {"", "0", "0", "1", "1"},
			  *ahead[V] = {"", "0", "0", "0", "1"};
	double v[V][99];
	uint64_t faults[V] = {0};
	for (int i = 0; i < runs; i++)
		for (int k = 0; k < V; k++)
			v[k][i] = k ? lazy_once(&ce, &sc, &log, n, win[k], pf[k], ahead[k], want,
						&faults[k])
				    : plain_once(dir, n, want);
	printf("{\"mib\": %u, \"runs\": %d, \"pages_touched\": %llu, \"unit\": \"ms to the last "
	       "page touched, median\"",
	       mib, runs, (unsigned long long)n);
	double med[V];
	for (int k = 0; k < V; k++) {
		qsort(v[k], (size_t)runs, sizeof(double), cmp_d);
		med[k] = v[k][runs / 2];
		printf(", \"%s_ms\": %.2f", names[k], med[k]);
		if (k)
			printf(", \"%s_faults_last_run\": %llu", names[k],
			       (unsigned long long)faults[k]);
	}
	printf(", \"ratios_over_plain\": {");
	for (int k = 1; k < V; k++)
		printf("\"%s\": %.3f%s", names[k], med[k] / med[0], k < V - 1 ? ", " : "}}\n");
	return 0;
}
