/* Unit tests of snapshot/layer_restore.c's layer_set_apply without KVM: RAM mapped privately from
 * a base layer, increments on top. Long runs of an increment are mapped from its file, short ones
 * copied, long holes become anonymous zero memory; later layers win wherever they overlap. */
#include <fcntl.h>
#include <stdbool.h>
#include <sys/mman.h>

#include "helpers.h"

#include "chain_fixture.h"
#include "snapshot/layer_restore.h"

#define PAGES 2048ULL /* 8 MiB: room for mapped runs and a hole of 2 MiB */
#define PG    MEM_LAYER_PAGE

/* What layer k holds at page p: -1 not held, 0 a zero page (a hole in the file), else a byte. */
static int held(int k, uint64_t p)
{
	switch (k) {
	case 0:
		return p >= 1200 ? 0 : (int)(p % 251) + 1;
	case 1:
		if (p >= 10 && p < 310)
			return 0xa1; /* 300 pages: mapped */
		if (p == 1050)
			return 0xa2; /* one page: copied */
		if (p >= 500 && p < 1020)
			return 0; /* 520 zero pages (> 2 MiB): anonymous memory */
		if (p >= 1100 && p < 1356)
			return 0xa3; /* exactly the shortest run that is mapped */
		if (p >= 1500 && p < 1532)
			return 0xa4; /* 32 pages: copied */
		return -1;
	default:
		if (p >= 20 && p < 23)
			return 0xb1; /* copied into layer 1's mapped run */
		if (p >= 250 && p < 550)
			return 0xb2; /* mapped over the end of layer 1's run and into its hole */
		return -1;
	}
}

static uint8_t expect(uint64_t p)
{
	for (int k = 2; k >= 0; k--)
		if (held(k, p) >= 0)
			return (uint8_t)held(k, p);
	return 0;
}

static void write_layer(struct chain *c, int k)
{
	struct mem_layer_info li;
	memset(&li, 0, sizeof(li));
	li.flags = k == 0 ? MEM_LAYER_FULL : 0;
	mem_layer_layout(&li, PAGES * PG);
	li.layer_id = c->layers[k].id;
	li.parent_id = c->layers[k].parent;
	memcpy(li.chain_id, c->chain_id, 16);
	uint8_t *bm = calloc(1, li.bitmap_len);
	assert_non_null(bm);
	char path[4200];
	snprintf(path, sizeof(path), "%s/%s", c->dir, c->layers[k].mem);
	uint8_t hdr[MEM_LAYER_HDR] = {0}, page[PG];
	fx_write(path, hdr, sizeof(hdr), 0, true);
	for (uint64_t p = 0; p < PAGES; p++) {
		int v = held(k, p);
		if (v < 0)
			continue;
		bm[p / 8] |= (uint8_t)(1u << (p % 8));
		li.present++;
		if (!v)
			continue; /* a hole */
		li.stored++;
		memset(page, v, sizeof(page));
		fx_write(path, page, sizeof(page), (off_t)(li.data_off + p * PG), false);
	}
	li.bitmap_crc = crc32_update(0, bm, li.bitmap_len);
	mem_layer_header_build(&li, hdr);
	fx_write(path, hdr, sizeof(hdr), 0, false);
	fx_write(path, bm, li.bitmap_len, (off_t)li.bitmap_off, false);
	assert_int_equal(truncate(path, (off_t)mem_layer_file_size(&li)), 0);
	c->layers[k].present = li.present;
	c->layers[k].stored = li.stored;
	free(bm);
}

/* The file mapped at `addr` in this process ("" for anonymous memory). */
static void mapped_file(const void *addr, char *out, size_t cap)
{
	FILE *f = fopen("/proc/self/maps", "r");
	assert_non_null(f);
	char line[4400];
	out[0] = '\0';
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		int pos = 0;
		if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &lo, &hi, &pos) < 2)
			continue;
		if ((uintptr_t)addr >= lo && (uintptr_t)addr < hi) {
			snprintf(out, cap, "%s", line + pos);
			out[strcspn(out, "\n")] = '\0';
			break;
		}
	}
	fclose(f);
}

static void test_apply_maps_copies_and_zeroes(void **state)
{
	(void)state;
	char dir[64];
	fx_mkdtemp(dir, sizeof(dir), "apply");
	struct chain c;
	memset(&c, 0, sizeof(c));
	snprintf(c.dir, sizeof(c.dir), "%s", dir);
	for (int i = 0; i < 16; i++)
		c.chain_id[i] = (uint8_t)(i + 1);
	c.ram_size = PAGES * PG;
	c.nr_layers = 3;
	for (int k = 0; k < 3; k++) {
		c.layers[k].id = (uint64_t)k + 1;
		c.layers[k].parent = (uint64_t)k;
		c.layers[k].full = k == 0;
		snprintf(c.layers[k].mem, sizeof(c.layers[k].mem), "mem-%d", k);
		write_layer(&c, k);
	}
	struct layer_set *ls = calloc(1, sizeof(*ls));
	assert_non_null(ls);
	char err[512] = "";
	assert_int_equal(layer_set_open(ls, &c, 2, err, sizeof(err)), 0);
	uint8_t *ram = mmap(NULL, PAGES * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE, ls->layers[0].fd,
			    (off_t)ls->layers[0].info.data_off);
	assert_true(ram != MAP_FAILED);
	uint64_t copied = 0;
	assert_int_equal(layer_set_apply(ls, ram, &copied), 0);
	/* Copied: page 1050, pages 1500-1531, 20-22 and the hole's 520 pages (mapped
	 * anonymously). */
	assert_int_equal(copied, 1 + 32 + 3 + 520);
	uint64_t data1 = ls->layers[1].info.data_off;
	layer_set_close(ls);
	for (uint64_t p = 0; p < PAGES; p++) {
		if (ram[p * PG] != expect(p) || ram[p * PG + PG - 1] != expect(p))
			fail_msg("page %llu holds %#x, not %#x", (unsigned long long)p, ram[p * PG],
				 expect(p));
	}
	char where[4400], want[4400];
	snprintf(want, sizeof(want), "%s/mem-1", dir);
	mapped_file(ram + 10 * PG, where, sizeof(where));
	assert_string_equal(where, want);
	mapped_file(ram + 1100 * PG, where, sizeof(where));
	assert_string_equal(where, want);
	mapped_file(ram + 800 * PG, where, sizeof(where));
	assert_string_equal(where, ""); /* the long hole: anonymous */
	snprintf(want, sizeof(want), "%s/mem-2", dir);
	mapped_file(ram + 260 * PG, where, sizeof(where));
	assert_string_equal(where, want);
	mapped_file(ram + 540 * PG, where, sizeof(where));
	assert_string_equal(where, want);
	snprintf(want, sizeof(want), "%s/mem-0", dir);
	mapped_file(ram + 1050 * PG, where, sizeof(where)); /* copied into the base mapping */
	assert_string_equal(where, want);
	mapped_file(ram + 1510 * PG, where, sizeof(where));
	assert_string_equal(where, want);
	/* Writes stay private: the layer files are unchanged. */
	memset(ram + 15 * PG, 0x77, PG);
	memset(ram + 200 * PG, 0x77, PG);
	snprintf(want, sizeof(want), "%s/mem-1", dir);
	int fd1 = open(want, O_RDONLY);
	assert_true(fd1 >= 0);
	uint8_t b = 0;
	assert_int_equal(pread(fd1, &b, 1, (off_t)(data1 + 15 * PG)), 1);
	assert_int_equal(b, 0xa1);
	assert_int_equal(pread(fd1, &b, 1, (off_t)(data1 + 200 * PG)), 1);
	assert_int_equal(b, 0xa1);
	close(fd1);
	munmap(ram, PAGES * PG);
	free(ls);
	fx_rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_apply_maps_copies_and_zeroes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
