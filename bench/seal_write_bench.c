/* Host micro-benchmark of an encrypted incremental layer's writing (no KVM): the pages of a
 * 4 GiB guest's layer that dirtied MIB MiB, already staged, written to a sparse layer file on a
 * real disk and fdatasync'ed, as snapshot.c does:
 *   plain      io_uring (or pwrite loop) + O_DIRECT where the file system takes it;
 *   enc_before what snapshot.c did before layer_seal.c: one thread seals page by page, tags
 *              written with one pwrite per extent, the file buffered (no O_DIRECT);
 *   enc_parallel  layer_seal() on layer_seal_threads() threads, tags in whole 4 KiB blocks,
 *              written like the data (O_DIRECT too); _1thread: one thread; _buffered: no
 *              O_DIRECT;
 *   enc_pipeline  layer_seal_write(): batches of SEAL_BATCH written by io_uring as soon as
 *              they are sealed, a helper thread sealing ahead of the writer (what snapshot.c
 *              does now where there is a second core); _1thread: the writer seals alone.
 * Runs interleaved; JSON on stdout with medians and encrypted/plain ratios per writer.
 * Usage: seal_write_bench DIR [MIB [RUNS]] */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/file_io.h"
#include "snapshot/crypto.h"
#include "snapshot/layer_seal.h"
#include "snapshot/layer_write.h"
#include "snapshot/seal_write.h"

#define PAGE	  4096ULL
#define RAM_PAGES (4ULL << 30) / PAGE
#define DATA_OFF  (2 * 4096ULL + 2 * 131072ULL) /* header + two 128 KiB bitmaps, aligned */
#define TAG_OFF	  (DATA_OFF + RAM_PAGES * PAGE)
#define FILE_SIZE (TAG_OFF + RAM_PAGES * 16)
#define MODES	  7

static const uint8_t salt[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
static const uint8_t chain[16] = {9};

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

struct setup {
	const char *dir;
	uint8_t *ram, *stage;
	size_t len;
	struct write_extent ext[1];
	struct snap_key *key;
	struct crypto_ctx *cc;
	uint64_t layer;
};

static int open_layer(const struct setup *s, int direct)
{
	char path[4200];
	snprintf(path, sizeof(path), "%s/seal-bench-layer", s->dir);
	unlink(path);
	int fd = direct ? open(path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0600) : -1;
	if (fd < 0)
		fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd >= 0 && ftruncate(fd, (off_t)FILE_SIZE) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Reads a few sealed pages back from the file (data and tag) and opens them. */
static int verify(struct setup *s, uint64_t first, uint64_t pages)
{
	char path[4200];
	snprintf(path, sizeof(path), "%s/seal-bench-layer", s->dir);
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return -errno;
	uint8_t *c = aligned_alloc(PAGE, PAGE), *o = aligned_alloc(PAGE, PAGE), tag[16];
	int r = c && o ? 0 : -ENOMEM;
	uint64_t probe[4] = {0, 1, pages / 2, pages - 1};
	for (int i = 0; i < 4 && !r; i++) {
		uint64_t p = first + probe[i];
		r = pread_full(fd, c, PAGE, (off_t)(DATA_OFF + p * PAGE));
		if (!r)
			r = pread_full(fd, tag, 16, (off_t)(TAG_OFF + p * 16));
		if (!r)
			r = crypto_open_page(s->cc, chain, s->layer, p, c, PAGE, o, tag);
		if (!r && memcmp(o, s->ram + probe[i] * PAGE, PAGE))
			r = -EBADMSG;
	}
	free(c);
	free(o);
	close(fd);
	return r;
}

/* The staged pages of the current layer, as snapshot.c hands them to the sealers. */
static struct seal_job stage_job(struct setup *s)
{
	return (struct seal_job){.cc = s->cc,
				 .key = s->key,
				 .chain_id = chain,
				 .layer_id = s->layer,
				 .salt = salt,
				 .data_off = DATA_OFF,
				 .tag_off = TAG_OFF,
				 .buf = s->stage,
				 .ext = s->ext,
				 .n = 1};
}

/* One layer written and synced; the staged copy (the pause's work) is not timed. */
static double one(struct setup *s, int mode, enum write_method m)
{
	memcpy(s->stage, s->ram, s->len);
	/* Each run a new layer (a fresh subkey): as snapshots do. */
	s->layer++;
	if (mode && crypto_ctx_add_layer(s->cc, s->layer, salt))
		return -1;
	int fd = open_layer(s, mode != 1 && mode != 4);
	if (fd < 0)
		return -1;
	double t0 = now();
	int r = 0;
	uint64_t pages = s->len / PAGE, first = (s->ext[0].file_off - DATA_OFF) / PAGE;
	if (mode == 1) {
		uint8_t *tags = malloc(pages * 16);
		for (uint64_t k = 0; k < pages && !r; k++)
			r = crypto_seal_page(s->cc, chain, s->layer, first + k, s->stage + k * PAGE,
					     PAGE, s->stage + k * PAGE, tags + k * 16);
		struct write_extent te = {TAG_OFF + first * 16, 0, pages * 16};
		if (!r)
			r = layer_write_extents(fd, WRITE_PWRITE, tags, pages * 16, &te, 1, NULL,
						NULL);
		free(tags);
		if (!r)
			r = layer_write_extents(fd, m, s->stage, s->len, s->ext, 1, NULL, NULL);
	} else if (mode >= 5) {
		struct seal_job j = stage_job(s);
		r = layer_seal_write(NULL, fd, m, &j, s->len, SEAL_BATCH, mode == 5 ? 1 : 0, NULL,
				     NULL);
	} else if (mode >= 2) {
		struct seal_tags t;
		struct seal_job j = stage_job(s);
		r = layer_seal(&j, mode == 3 ? 1 : layer_seal_threads(pages), &t);
		if (!r)
			r = layer_write_extents(fd, m, s->stage, s->len, s->ext, 1, NULL, NULL);
		if (!r)
			r = layer_write_extents(fd, m, t.buf, t.len, t.ext, t.n, NULL, NULL);
		seal_tags_free(&t);
	} else {
		r = layer_write_extents(fd, m, s->stage, s->len, s->ext, 1, NULL, NULL);
	}
	if (!r && fdatasync(fd) < 0)
		r = -errno;
	double t = now() - t0;
	close(fd);
	if (!r && mode)
		r = verify(s, first, pages);
	if (r) {
		fprintf(stderr, "seal_write_bench: mode %d: %s\n", mode, strerror(-r));
		return -1;
	}
	return t * 1e3;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: seal_write_bench DIR [MIB [RUNS]]\n");
		return 2;
	}
	struct setup s = {.dir = argv[1]};
	unsigned mib = argc > 2 ? (unsigned)atoi(argv[2]) : 40;
	int runs = argc > 3 ? atoi(argv[3]) : 9;
	if (!mib || mib > 1024 || runs < 1 || runs > 99)
		return 2;
	s.len = (size_t)mib << 20;
	s.ram = aligned_alloc(PAGE, s.len);
	s.stage = aligned_alloc(PAGE, s.len);
	if (!s.ram || !s.stage || crypto_random(s.ram, s.len) || crypto_key_generate(&s.key) ||
	    crypto_ctx_new(s.key, &s.cc))
		return 1;
	/* The stamper's dirty pages: one run from 16 MiB up. */
	s.ext[0] = (struct write_extent){DATA_OFF + (16ULL << 20), 0, s.len};
	static const char *names[MODES] = {"plain",
					   "enc_before",
					   "enc_parallel",
					   "enc_parallel_1thread",
					   "enc_parallel_buffered",
					   "enc_pipeline",
					   "enc_pipeline_1thread"};
	static const char *wn[2] = {"uring", "pwrite"};
	double v[2][MODES][99];
	for (int i = 0; i < runs; i++)
		for (int w = 0; w < 2; w++)
			for (int mode = 0; mode < MODES; mode++)
				if ((v[w][mode][i] =
					 one(&s, mode, w ? WRITE_PWRITE : WRITE_URING)) < 0)
					return 1;
	printf("{\"mib\": %u, \"runs\": %d, \"seal_threads\": %u, \"unit\": \"ms, median\"", mib,
	       runs, layer_seal_threads(s.len / PAGE));
	for (int w = 0; w < 2; w++) {
		double med[MODES];
		printf(", \"%s\": {", wn[w]);
		for (int mode = 0; mode < MODES; mode++) {
			qsort(v[w][mode], (size_t)runs, sizeof(double), cmp_d);
			med[mode] = v[w][mode][runs / 2];
			printf("\"%s_ms\": %.2f, ", names[mode], med[mode]);
		}
		printf("\"ratios_over_plain\": {");
		for (int mode = 1; mode < MODES; mode++)
			printf("\"%s\": %.3f%s", names[mode], med[mode] / med[0],
			       mode < MODES - 1 ? ", " : "");
		printf("}}");
	}
	printf("}\n");
	char path[4200];
	snprintf(path, sizeof(path), "%s/seal-bench-layer", s.dir);
	unlink(path);
	return 0;
}
