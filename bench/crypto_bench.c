/* bench/crypto: AES-256-GCM seal/open throughput of 4 KiB snapshot pages on one core, as JSON. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "snapshot/crypto.h"

#define PAGE	   4096
#define NPAGE_COLD 16384 /* 64 MiB: larger than the caches, like a real layer */
#define NPAGE_HOT  64	 /* 256 KiB: in cache, the per-page cost of the cipher alone */

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

enum op { SEAL, OPEN, SEAL_NEW_CTX, MEMCPY };

struct bench {
	struct snap_key *key;
	struct crypto_ctx *cc;
	uint8_t chain[CRYPTO_CHAIN_ID_LEN];
	uint8_t *plain, *cipher, *out, *tags;
	uint64_t npage;
};

/* MB/s (10^6 bytes) of one pass over the working set. */
/* Pages are sealed under a layer's subkey (snapshot/CRYPTO.md): one fixed salt here. */
static const uint8_t bench_salt[CRYPTO_SALT_LEN] = {1};

static double pass(struct bench *b, enum op op, uint64_t layer)
{
	double t0 = now_s();
	for (uint64_t i = 0; i < b->npage; i++) {
		uint8_t *p = b->plain + i * PAGE, *c = b->cipher + i * PAGE, *o = b->out + i * PAGE;
		uint8_t *tag = b->tags + i * CRYPTO_TAG_LEN;
		int r = 0;
		switch (op) {
		case SEAL:
			r = crypto_seal_page(b->cc, b->chain, layer, i, p, PAGE, c, tag);
			break;
		case OPEN:
			r = crypto_open_page(b->cc, b->chain, layer, i, c, PAGE, o, tag);
			break;
		case SEAL_NEW_CTX: {
			struct crypto_ctx *cc;
			r = crypto_ctx_new(b->key, &cc);
			if (!r)
				r = crypto_ctx_add_layer(cc, layer, bench_salt);
			if (!r)
				r = crypto_seal_page(cc, b->chain, layer, i, p, PAGE, c, tag);
			crypto_ctx_free(cc);
			break;
		}
		case MEMCPY:
			memcpy(o, p, PAGE);
			__asm__ volatile("" : : "r"(o) : "memory");
			break;
		}
		if (r) {
			fprintf(stderr, "crypto_bench: op %d page %lu: %s\n", op, (unsigned long)i,
				strerror(-r));
			exit(1);
		}
	}
	return (double)b->npage * PAGE / (now_s() - t0) / 1e6;
}

int main(int argc, char **argv)
{
	int reps = argc > 1 ? atoi(argv[1]) : 7;
	if (reps < 1 || reps > 1000) {
		fprintf(stderr, "usage: crypto_bench [REPS]\n");
		return 2;
	}
	struct bench b = {0};
	size_t sz = (size_t)NPAGE_COLD * PAGE;
	b.plain = malloc(sz);
	b.cipher = malloc(sz);
	b.out = malloc(sz);
	b.tags = malloc((size_t)NPAGE_COLD * CRYPTO_TAG_LEN);
	if (!b.plain || !b.cipher || !b.out || !b.tags || crypto_key_generate(&b.key) ||
	    crypto_ctx_new(b.key, &b.cc) || crypto_ctx_add_layer(b.cc, 0, bench_salt) ||
	    crypto_random(b.chain, sizeof(b.chain)) || crypto_random(b.plain, sz)) {
		fprintf(stderr, "crypto_bench: setup failed\n");
		return 1;
	}
	memset(b.out, 1, sz);
	memset(b.cipher, 1, sz);
	static const char *names[] = {"seal", "open", "seal_new_ctx_per_page", "memcpy"};
	double med[2][4];
	double *v = calloc((size_t)reps * 40, sizeof(double));
	for (int set = 0; set < 2; set++) {
		/* the hot set repeats passes so each sample lasts about as long as a cold one */
		int inner = set ? NPAGE_COLD / NPAGE_HOT : 1;
		b.npage = set ? NPAGE_HOT : NPAGE_COLD;
		pass(&b, SEAL, 0); /* warm up: fault in the buffers */
		for (int op = 0; op < 4; op++) {
			for (int r = 0; r < reps; r++) {
				double sum = 0;
				for (int k = 0; k < inner; k++)
					sum += 1.0 / pass(&b, (enum op)op, 0);
				v[r] = inner / sum;
			}
			qsort(v, (size_t)reps, sizeof(double), cmp_d);
			med[set][op] = v[reps / 2];
			fprintf(stderr, "%s %s: median %.0f MB/s (min %.0f, max %.0f)\n",
				set ? "hot" : "cold", names[op], med[set][op], v[0], v[reps - 1]);
			if (op == OPEN && memcmp(b.out, b.plain, (size_t)b.npage * PAGE) != 0) {
				fprintf(stderr, "crypto_bench: round trip mismatch\n");
				return 1;
			}
		}
	}
	printf("{\n  \"page_bytes\": %d,\n  \"reps\": %d,\n  \"threads\": 1,\n", PAGE, reps);
	printf("  \"unit\": \"MB/s (1e6 bytes/s), median of reps\",\n");
	for (int set = 0; set < 2; set++) {
		printf("  \"%s\": {\n", set ? "hot_256KiB" : "cold_64MiB");
		printf("    \"seal_mbps\": %.0f,\n    \"open_mbps\": %.0f,\n", med[set][SEAL],
		       med[set][OPEN]);
		printf("    \"seal_new_ctx_per_page_mbps\": %.0f,\n", med[set][SEAL_NEW_CTX]);
		printf("    \"memcpy_mbps\": %.0f,\n", med[set][MEMCPY]);
		printf("    \"seal_us_per_page\": %.3f,\n    \"open_us_per_page\": %.3f,\n",
		       PAGE / med[set][SEAL], PAGE / med[set][OPEN]);
		printf("    \"ctx_reuse_speedup\": %.2f\n  }%s\n",
		       med[set][SEAL] / med[set][SEAL_NEW_CTX], set ? "" : ",");
	}
	printf("}\n");
	free(v);
	crypto_ctx_free(b.cc);
	crypto_key_free(b.key);
	free(b.plain);
	free(b.cipher);
	free(b.out);
	free(b.tags);
	return 0;
}
