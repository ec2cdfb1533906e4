/* Unit tests of the snapshot files on disk: state file reads, memory layer opens, chain.json
 * commit/load, extent writes (io_uring and pwrite). */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <sys/stat.h>

#include "helpers.h"
#include "common/byteorder.h"
#include "snapshot/chain.h"
#include "common/crc32.h"
#include "common/dirfd_io.h"
#include "snapshot/digest.h"
#include "snapshot/layer_write.h"
#include <openssl/sha.h>
#include "snapshot/mem_layer.h"
#include "snapshot/state_file.h"

struct fx {
	char dir[64];
	char path[128];
};

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	if (!f)
		return -1;
	snprintf(f->dir, sizeof(f->dir), "/tmp/cove-snapfiles-XXXXXX");
	if (!mkdtemp(f->dir)) {
		free(f);
		return -1;
	}
	*state = f;
	return 0;
}

/* Removes every plain file in the directory, then the directory. */
static int teardown(void **state)
{
	struct fx *f = *state;
	DIR *d = opendir(f->dir);
	if (d) {
		struct dirent *e;
		char p[512];
		while ((e = readdir(d)))
			if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
				snprintf(p, sizeof(p), "%s/%s", f->dir, e->d_name);
				unlink(p);
			}
		closedir(d);
	}
	rmdir(f->dir);
	free(f);
	return 0;
}

static void write_file(const char *path, const void *buf, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, buf, len), (ssize_t)len);
	close(fd);
}

static void pwrite_at(const char *path, const void *buf, size_t len, off_t off)
{
	int fd = open(path, O_WRONLY);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, buf, len, off), (ssize_t)len);
	close(fd);
}

static void set_size(const char *path, off_t size)
{
	assert_int_equal(truncate(path, size), 0);
}

/* The whole file, malloc'd (at least 1 byte). */
static uint8_t *read_all(const char *path, size_t *len)
{
	int fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	struct stat st;
	assert_int_equal(fstat(fd, &st), 0);
	uint8_t *p = malloc((size_t)st.st_size + 1);
	assert_non_null(p);
	size_t got = 0;
	while (got < (size_t)st.st_size) {
		ssize_t k = pread(fd, p + got, (size_t)st.st_size - got, (off_t)got);
		assert_true(k > 0);
		got += (size_t)k;
	}
	close(fd);
	*len = got;
	return p;
}

/* ---- state file ---- */

static void test_state_read_file(void **state)
{
	struct fx *f = *state;
	struct state_buf b;
	state_buf_init(&b);
	state_put(&b, SEC_CONFIG, 0, "{}", 2);
	state_put(&b, SEC_VCPU_REGS, 1, "0123456789", 10);
	assert_int_equal(state_finish(&b), 0);
	snprintf(f->path, sizeof(f->path), "%s/state-1", f->dir);
	write_file(f->path, b.p, b.len);

	uint8_t *buf;
	size_t len;
	char err[256] = "";
	assert_int_equal(state_read_file(f->path, &buf, &len, err, sizeof(err)), 0);
	assert_int_equal(len, b.len);
	assert_memory_equal(buf, b.p, len);
	struct state_section_ref *s;
	size_t n;
	assert_int_equal(state_parse(buf, len, &s, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 2);
	assert_memory_equal(state_find(s, n, SEC_VCPU_REGS, 1)->payload, "0123456789", 10);
	free(s);
	free(buf);

	/* Truncated on disk: read, then the parse says so. */
	set_size(f->path, (off_t)b.len - 3);
	assert_int_equal(state_read_file(f->path, &buf, &len, err, sizeof(err)), 0);
	assert_int_equal(state_parse(buf, len, &s, &n, err, sizeof(err)), -EINVAL);
	assert_one_line_error(err, "truncated");
	free(buf);
	set_size(f->path, 0);
	assert_int_equal(state_read_file(f->path, &buf, &len, err, sizeof(err)), 0);
	assert_int_equal(len, 0);
	assert_int_equal(state_parse(buf, len, &s, &n, err, sizeof(err)), -EINVAL);
	assert_one_line_error(err, "truncated (0 bytes)");
	free(buf);

	/* Over the cap: refused before reading (sparse, so cheap). */
	set_size(f->path, STATE_HDR_SIZE + (off_t)STATE_MAX_BODY + 1);
	err[0] = '\0';
	assert_int_equal(state_read_file(f->path, &buf, &len, err, sizeof(err)), -EFBIG);
	assert_null(buf);
	assert_one_line_error(err, "too large");

	char missing[160];
	snprintf(missing, sizeof(missing), "%s/no-such-state", f->dir);
	assert_int_equal(state_read_file(missing, &buf, &len, err, sizeof(err)), -ENOENT);
	assert_one_line_error(err, "no-such-state");
	state_buf_free(&b);
}

/* ---- memory layers ---- */

#define L_PAGES 100 /* not a multiple of 64: a partial last bitmap word */

static const uint64_t held[] = {0, 5, 63, 64, 99};

/* Writes a valid sparse layer of L_PAGES pages holding `held`; *li gets its header. */
static void write_layer(const char *path, struct mem_layer_info *li)
{
	memset(li, 0, sizeof(*li));
	mem_layer_layout(li, L_PAGES * MEM_LAYER_PAGE);
	li->layer_id = 2;
	li->parent_id = 1;
	li->present = sizeof(held) / sizeof(held[0]);
	li->stored = li->present - 1;
	memset(li->chain_id, 0x42, sizeof(li->chain_id));
	uint8_t *bm = calloc(1, li->bitmap_len);
	assert_non_null(bm);
	for (size_t i = 0; i < sizeof(held) / sizeof(held[0]); i++)
		bm[held[i] / 8] |= (uint8_t)(1u << (held[i] % 8));
	li->bitmap_crc = crc32_update(0, bm, li->bitmap_len);
	uint8_t hdr[MEM_LAYER_HDR];
	mem_layer_header_build(li, hdr);
	write_file(path, hdr, sizeof(hdr));
	pwrite_at(path, bm, li->bitmap_len, (off_t)li->bitmap_off);
	uint8_t page[MEM_LAYER_PAGE];
	memset(page, 0x5a, sizeof(page));
	pwrite_at(path, page, sizeof(page), (off_t)(li->data_off + 5 * MEM_LAYER_PAGE));
	set_size(path, (off_t)mem_layer_file_size(li));
	free(bm);
}

/* Rewrites the header of the layer at `path` from *li. */
static void rewrite_header(const char *path, const struct mem_layer_info *li)
{
	uint8_t hdr[MEM_LAYER_HDR];
	mem_layer_header_build(li, hdr);
	pwrite_at(path, hdr, sizeof(hdr), 0);
}

static void expect_open_error(const char *path, int want, const char *needle)
{
	struct mem_layer l;
	char err[512] = "";
	int r = mem_layer_open(&l, path, err, sizeof(err));
	if (r != want)
		fail_msg("%s: r=%d (want %d): %s", path, r, want, err);
	assert_one_line_error(err, needle);
	assert_non_null(strstr(err, path));
	assert_null(l.bitmap);
}

static void test_mem_layer_open(void **state)
{
	struct fx *f = *state;
	struct mem_layer_info li;
	snprintf(f->path, sizeof(f->path), "%s/mem-2", f->dir);
	write_layer(f->path, &li);
	assert_int_equal(li.bitmap_len, 16);
	assert_int_equal(mem_layer_file_size(&li), 8192 + L_PAGES * 4096);

	struct mem_layer l;
	char err[512] = "";
	int r = mem_layer_open(&l, f->path, err, sizeof(err));
	if (r)
		fail_msg("%s", err);
	assert_true(l.fd >= 0);
	assert_memory_equal(&l.info, &li, sizeof(li));
	for (uint64_t p = 0; p < L_PAGES + 64; p++) {
		bool want = false;
		for (size_t i = 0; i < sizeof(held) / sizeof(held[0]); i++)
			want |= held[i] == p;
		assert_int_equal(mem_layer_has(&l, p), want);
	}
	assert_false(mem_layer_has(&l, UINT64_MAX));
	mem_layer_close(&l);
	assert_int_equal(l.fd, -1);
	assert_null(l.bitmap);
	mem_layer_close(&l); /* twice is harmless */

	/* Wrong file sizes. */
	const off_t size = (off_t)mem_layer_file_size(&li);
	static const off_t deltas[] = {-1, -4096, -(L_PAGES * 4096), 1, 4096};
	for (size_t i = 0; i < sizeof(deltas) / sizeof(deltas[0]); i++) {
		set_size(f->path, size + deltas[i]);
		expect_open_error(f->path, -EINVAL, "truncated or too long");
	}
	set_size(f->path, MEM_LAYER_HDR);
	expect_open_error(f->path, -EINVAL, "truncated or too long");
	set_size(f->path, 100);
	expect_open_error(f->path, -EINVAL, "truncated (no header)");
	set_size(f->path, 0);
	expect_open_error(f->path, -EINVAL, "truncated (no header)");

	/* A corrupt header names the file and the reason. */
	write_layer(f->path, &li);
	uint8_t x = 0x77;
	pwrite_at(f->path, &x, 1, 200);
	expect_open_error(f->path, -EINVAL, "CRC mismatch");
	write_layer(f->path, &li);
	pwrite_at(f->path, "COVESTAT", 8, 0);
	expect_open_error(f->path, -EINVAL, "bad magic");
	struct mem_layer_info v2 = li;
	write_layer(f->path, &li);
	{
		uint8_t hdr[MEM_LAYER_HDR];
		mem_layer_header_build(&v2, hdr);
		put_le32(hdr + 8, 9);
		put_le32(hdr + MEM_LAYER_HDR - 4, crc32_update(0, hdr, MEM_LAYER_HDR - 4));
		pwrite_at(f->path, hdr, sizeof(hdr), 0);
	}
	expect_open_error(f->path, -EINVAL, "version 9 is not supported");

	/* Bitmap CRC wrong: one flipped bit in the bitmap on disk. */
	write_layer(f->path, &li);
	uint8_t bm0 = 0x01 | 0x20 | 0x02; /* pages 0, 5 and a new page 1 */
	pwrite_at(f->path, &bm0, 1, (off_t)li.bitmap_off);
	expect_open_error(f->path, -EINVAL, "page bitmap is corrupt");
	/* Header's bitmap CRC wrong instead. */
	write_layer(f->path, &li);
	struct mem_layer_info bad = li;
	bad.bitmap_crc ^= 1;
	rewrite_header(f->path, &bad);
	expect_open_error(f->path, -EINVAL, "page bitmap is corrupt");

	/* Bitmap popcount differs from the header's page count (both CRCs right). */
	write_layer(f->path, &li);
	bad = li;
	bad.present = li.present + 1;
	rewrite_header(f->path, &bad);
	expect_open_error(f->path, -EINVAL, "bitmap holds 5 pages, header 6");
	bad.present = li.present - 1;
	bad.stored = bad.present;
	rewrite_header(f->path, &bad);
	expect_open_error(f->path, -EINVAL, "bitmap holds 5 pages, header 4");
	bad.present = 0;
	bad.stored = 0;
	rewrite_header(f->path, &bad);
	expect_open_error(f->path, -EINVAL, "bitmap holds 5 pages, header 0");

	/* RAM size changed (offsets re-derived so the header is self-consistent): size check. */
	write_layer(f->path, &li);
	bad = li;
	mem_layer_layout(&bad, (L_PAGES + 1) * MEM_LAYER_PAGE);
	rewrite_header(f->path, &bad);
	expect_open_error(f->path, -EINVAL, "truncated or too long");

	/* Not there; a directory. */
	char missing[160];
	snprintf(missing, sizeof(missing), "%s/no-such-layer", f->dir);
	expect_open_error(missing, -ENOENT, "cannot open");
	expect_open_error(f->dir, -EINVAL, "truncated (no header)");
}

/* ---- chain.json ---- */

static void sample_chain(struct chain *c, const char *dir, int n)
{
	memset(c, 0, sizeof(*c));
	snprintf(c->dir, sizeof(c->dir), "%s", dir);
	for (int i = 0; i < 16; i++)
		c->chain_id[i] = (uint8_t)(i * 17 + 1);
	c->ram_size = 1ULL << 30;
	c->nr_layers = n;
	for (int i = 0; i < n; i++) {
		struct chain_layer *l = &c->layers[i];
		l->id = (uint64_t)(i * 3 + 1);
		l->parent = i ? c->layers[i - 1].id : 0;
		l->full = i == 0;
		snprintf(l->mem, sizeof(l->mem), "mem-%d", i);
		snprintf(l->state, sizeof(l->state), "state-%d.bin", i);
		l->present = 1000ULL * (uint64_t)(i + 1);
		l->stored = 500ULL * (uint64_t)(i + 1);
		l->created_ns =
		    i == n - 1 ? (uint64_t)INT64_MAX : 1700000000000000000ULL + (uint64_t)i;
	}
}

/* The layer files a sample chain names (chain_commit digests every one it lists). */
static void sample_files(const struct chain *c)
{
	for (int i = 0; i < c->nr_layers; i++) {
		char p[4200];
		snprintf(p, sizeof(p), "%s/%s", c->dir, c->layers[i].mem);
		write_file(p, c->layers[i].mem, strlen(c->layers[i].mem));
		snprintf(p, sizeof(p), "%s/%s", c->dir, c->layers[i].state);
		write_file(p, c->layers[i].state, strlen(c->layers[i].state));
	}
}

/* The directory's chain files: exactly `want` (names, NULL-terminated), and no other dot-file. */
static void assert_chain_files(const char *dir, const char *const *want)
{
	DIR *d = opendir(dir);
	assert_non_null(d);
	struct dirent *e;
	int files = 0, nwant = 0;
	while (want[nwant])
		nwant++;
	while ((e = readdir(d))) {
		const char *n = e->d_name;
		if (!strcmp(n, ".") || !strcmp(n, ".."))
			continue;
		if (n[0] == '.')
			fail_msg("temporary file %s left in %s", n, dir);
		if (strncmp(n, "chain", 5))
			continue;
		bool ok = false;
		for (int i = 0; i < nwant; i++)
			ok |= !strcmp(n, want[i]);
		if (!ok)
			fail_msg("unexpected file %s in %s", n, dir);
		files++;
	}
	closedir(d);
	assert_int_equal(files, nwant);
}

static void test_chain_commit_load(void **state)
{
	struct fx *f = *state;
	struct chain *c = malloc(sizeof(*c)), *back = malloc(sizeof(*back));
	assert_non_null(c);
	assert_non_null(back);
	char err[512] = "";

	/* No chain yet. */
	assert_int_equal(chain_load(f->dir, back, err, sizeof(err)), -ENOENT);
	assert_one_line_error(err, CHAIN_FILE);

	/* The first commit creates chain.json, the next one chain.0000000002.json. */
	static const char *const g1[] = {CHAIN_FILE, NULL};
	static const char *const g2[] = {CHAIN_FILE, "chain.0000000002.json", NULL};
	uint8_t *gen1 = NULL;
	size_t gen1_len = 0;
	for (int n = 1; n <= 4; n += 3) {
		sample_chain(c, f->dir, n);
		sample_files(c);
		c->gen = n == 1 ? 0 : 1;
		int r = chain_commit(c, err, sizeof(err));
		if (r)
			fail_msg("%s", err);
		assert_int_equal(c->gen, n == 1 ? 1 : 2);
		assert_chain_files(f->dir, n == 1 ? g1 : g2);
		memset(back, 0x33, sizeof(*back));
		r = chain_load(f->dir, back, err, sizeof(err));
		if (r)
			fail_msg("%s", err);
		assert_string_equal(back->dir, f->dir);
		assert_string_equal(back->source, n == 1 ? CHAIN_FILE : "chain.0000000002.json");
		assert_string_equal(back->warning, "");
		assert_true(back->has_digests);
		assert_int_equal(back->gen, c->gen);
		assert_memory_equal(back->chain_id, c->chain_id, 16);
		assert_int_equal(back->ram_size, c->ram_size);
		assert_int_equal(back->nr_layers, n);
		for (int i = 0; i < n; i++)
			assert_memory_equal(&back->layers[i], &c->layers[i], sizeof(c->layers[i]));
		assert_int_equal(chain_latest(back)->id, (uint64_t)((n - 1) * 3 + 1));
		if (n == 1) {
			char p[200];
			snprintf(p, sizeof(p), "%s/%s", f->dir, CHAIN_FILE);
			gen1 = read_all(p, &gen1_len);
		}
		/* Every layer's files carry their content digest. */
		uint8_t d[32];
		assert_int_equal(digest_buf("mem-0", 5, d), 0);
		assert_memory_equal(chain_digest_get(back, "mem-0"), d, 32);
	}
	/* Outside the jail chain.json follows each commit (best effort); in it, it would stay at
	 * generation 1: put that back, so what follows reads as it would there. */
	char cj[200];
	snprintf(cj, sizeof(cj), "%s/%s", f->dir, CHAIN_FILE);
	size_t cjlen;
	uint8_t *cjtext = read_all(cj, &cjlen);
	assert_non_null(strstr((char *)cjtext, "\"generation\": 2"));
	free(cjtext);
	write_file(cj, gen1, gen1_len);
	free(gen1);
	snprintf(f->path, sizeof(f->path), "%s/chain.0000000002.json", f->dir);
	struct stat st;
	assert_int_equal(stat(f->path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);

	/* A chain file padded to exactly the cap loads; one byte more is skipped, with a warning.
	 */
	size_t len;
	uint8_t *text = read_all(f->path, &len);
	char *big = malloc(CHAIN_MAX_BYTES + 2);
	assert_non_null(big);
	memset(big, ' ', CHAIN_MAX_BYTES + 1);
	memcpy(big, text, len);
	write_file(f->path, big, CHAIN_MAX_BYTES);
	assert_int_equal(chain_load(f->dir, back, err, sizeof(err)), 0);
	assert_int_equal(back->nr_layers, 4);
	write_file(f->path, big, CHAIN_MAX_BYTES + 1);
	assert_int_equal(chain_load(f->dir, back, err, sizeof(err)), 0);
	assert_string_equal(back->source, CHAIN_FILE);
	assert_int_equal(back->nr_layers, 1);
	assert_one_line_error(back->warning, "larger than");
	assert_non_null(strstr(back->warning, "chain.0000000002.json"));
	free(big);

	/* Truncated newest: skipped with one warning naming it; the older generation is read. */
	write_file(f->path, text, len / 2);
	assert_int_equal(chain_load(f->dir, back, err, sizeof(err)), 0);
	assert_int_equal(back->gen, 1);
	assert_one_line_error(back->warning, "not valid JSON");
	/* A generation file that says another generation (a copy or a rename): skipped. */
	char other[200];
	snprintf(other, sizeof(other), "%s/chain.0000000009.json", f->dir);
	write_file(other, text, len);
	assert_int_equal(chain_load(f->dir, back, err, sizeof(err)), 0);
	assert_int_equal(back->gen, 1);
	assert_non_null(strstr(back->warning, "says generation 2"));
	assert_int_equal(unlink(other), 0);
	/* A link named like a generation is not followed. */
	assert_int_equal(symlink(f->path, other), 0);
	assert_int_equal(chain_load(f->dir, back, err, sizeof(err)), 0);
	assert_int_equal(back->gen, 1);
	assert_int_equal(unlink(other), 0);
	/* With chain.json broken too, nothing is valid: refused. */
	write_file(cj, text, 0);
	assert_int_equal(chain_load(f->dir, back, err, sizeof(err)), -EINVAL);
	assert_one_line_error(err, "no valid chain generation");
	/* A lone broken chain.json: its own error. */
	assert_int_equal(unlink(f->path), 0);
	assert_int_equal(chain_load(f->dir, back, err, sizeof(err)), -EINVAL);
	assert_one_line_error(err, "not valid JSON");
	free(text);

	/* A new commit never replaces anything: it creates the next generation past a broken one.
	 */
	write_file(f->path, "{", 1);
	sample_chain(c, f->dir, 2);
	assert_int_equal(chain_commit(c, err, sizeof(err)), 0);
	assert_int_equal(c->gen, 3);
	assert_int_equal(chain_load(f->dir, back, err, sizeof(err)), 0);
	assert_int_equal(back->nr_layers, 2);
	assert_int_equal(back->gen, 3);

	/* A directory that is not there; a name that does not fit. */
	char gone[160];
	snprintf(gone, sizeof(gone), "%s/gone", f->dir);
	sample_chain(c, gone, 1);
	err[0] = '\0';
	assert_int_equal(chain_commit(c, err, sizeof(err)), -ENOENT);
	assert_one_line_error(err, "gone");
	char *longdir = malloc(5000);
	assert_non_null(longdir);
	memset(longdir, 'd', 4999);
	longdir[4999] = '\0';
	assert_int_equal(chain_load(longdir, back, err, sizeof(err)), -ENAMETOOLONG);
	assert_one_line_error(err, "too long");
	free(longdir);
	free(back);
	free(c);
}

/* Newest wins; past CHAIN_GEN_TRY_MAX hostile newest generations the chain is refused. */
static void test_chain_generations_hostile(void **state)
{
	struct fx *f = *state;
	struct chain *c = malloc(sizeof(*c)), *back = malloc(sizeof(*back));
	assert_non_null(c);
	assert_non_null(back);
	char err[512] = "", p[200];
	sample_chain(c, f->dir, 1);
	sample_files(c);
	for (int i = 0; i < 3; i++)
		assert_int_equal(chain_commit(c, err, sizeof(err)), 0);
	assert_int_equal(c->gen, 3);
	assert_int_equal(chain_load(f->dir, back, err, sizeof(err)), 0);
	assert_string_equal(back->source, "chain.0000000003.json");
	/* Names that are not generations are never read. */
	snprintf(p, sizeof(p), "%s/chain.99.json", f->dir);
	write_file(p, "{", 1);
	snprintf(p, sizeof(p), "%s/chain.00000000010.json", f->dir);
	write_file(p, "{", 1);
	assert_int_equal(chain_load(f->dir, back, err, sizeof(err)), 0);
	assert_string_equal(back->warning, "");
	/* A few bad newest ones are skipped with one warning line. */
	for (int g = 4; g < 4 + CHAIN_GEN_TRY_MAX - 1; g++) {
		snprintf(p, sizeof(p), "%s/chain.%010d.json", f->dir, g);
		write_file(p, "garbage", 7);
	}
	assert_int_equal(chain_load(f->dir, back, err, sizeof(err)), 0);
	assert_int_equal(back->gen, 3);
	assert_one_line_error(back->warning, "skipped 15 chain file(s)");
	/* One more and the valid one is out of reach: refused, in one line. */
	snprintf(p, sizeof(p), "%s/chain.%010d.json", f->dir, 4 + CHAIN_GEN_TRY_MAX);
	write_file(p, "garbage", 7);
	assert_int_equal(chain_load(f->dir, back, err, sizeof(err)), -EINVAL);
	assert_one_line_error(err, "no valid chain generation");
	free(back);
	free(c);
}

static bool present(const char *dir, const char *name)
{
	char p[300];
	struct stat st;
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return lstat(p, &st) == 0;
}

/* chain_settle: chain.json from the newest generation; only our own leftovers go. */
static void test_chain_settle(void **state)
{
	struct fx *f = *state;
	struct chain *c = malloc(sizeof(*c)), *back = malloc(sizeof(*back));
	assert_non_null(c);
	assert_non_null(back);
	char err[512] = "", p[200], canary[200];
	/* Nothing there: nothing to do. */
	assert_int_equal(chain_settle(f->dir, err, sizeof(err)), 0);
	sample_chain(c, f->dir, 4);
	sample_files(c);
	assert_int_equal(chain_commit(c, err, sizeof(err)), 0);
	c->nr_layers = 2; /* a later generation lists fewer layers (as after compaction) */
	assert_int_equal(chain_commit(c, err, sizeof(err)), 0);
	/* Leftovers of crashed commits, hostile names, links and a directory. */
	static const char *const ours[] = {".mem-000005.123-abcdef01.tmp",
					   ".state-000005.123-abcdef01.tmp",
					   ".mem-000005.tmp",
					   ".chain.json.tmp",
					   ".chain.0000000003.json.9-00000000.tmp",
					   "mem-000007",
					   "mem-000003-c2"};
	static const char *const theirs[] = {"junk",	   ".mem-x/y",	       "mem-1x",
					     ".keys.tmp",  "disk0-000001.ovl", "state-0.bin.bak",
					     ".mem-0.tmpx"};
	for (size_t i = 0; i < sizeof(ours) / sizeof(ours[0]); i++) {
		snprintf(p, sizeof(p), "%s/%s", f->dir, ours[i]);
		write_file(p, "x", 1);
	}
	for (size_t i = 0; i < sizeof(theirs) / sizeof(theirs[0]); i++) {
		if (strchr(theirs[i], '/'))
			continue;
		snprintf(p, sizeof(p), "%s/%s", f->dir, theirs[i]);
		write_file(p, "x", 1);
	}
	snprintf(canary, sizeof(canary), "%s/canary", f->dir);
	write_file(canary, "keep", 4);
	/* Links and a directory with names settle would remove as files: left alone. */
	snprintf(p, sizeof(p), "%s/.state-000009.tmp", f->dir);
	assert_int_equal(symlink(canary, p), 0);
	snprintf(p, sizeof(p), "%s/mem-000008", f->dir);
	assert_int_equal(symlink(canary, p), 0);
	snprintf(p, sizeof(p), "%s/mem-000009", f->dir);
	assert_int_equal(mkdir(p, 0700), 0);
	assert_int_equal(chain_settle(f->dir, err, sizeof(err)), 0);
	assert_true(present(f->dir, CHAIN_FILE));
	assert_false(present(f->dir, "chain.0000000002.json"));
	for (size_t i = 0; i < sizeof(ours) / sizeof(ours[0]); i++)
		if (present(f->dir, ours[i]))
			fail_msg("%s was left", ours[i]);
	for (size_t i = 0; i < sizeof(theirs) / sizeof(theirs[0]); i++)
		if (!strchr(theirs[i], '/') && !present(f->dir, theirs[i]))
			fail_msg("%s was removed", theirs[i]);
	/* Layers the settled chain lists stay; those it no longer lists go. */
	assert_true(present(f->dir, "mem-0") && present(f->dir, "state-1.bin"));
	assert_false(present(f->dir, "mem-2") || present(f->dir, "mem-3"));
	assert_true(present(f->dir, "state-3.bin")); /* not a name cove gives a state file */
	assert_true(present(f->dir, ".state-000009.tmp") && present(f->dir, "mem-000008") &&
		    present(f->dir, "mem-000009") && present(f->dir, "canary"));
	/* chain.json holds the newest generation; the next commit goes on past it. */
	assert_int_equal(chain_load(f->dir, back, err, sizeof(err)), 0);
	assert_string_equal(back->source, CHAIN_FILE);
	assert_int_equal(back->gen, 2);
	assert_int_equal(back->nr_layers, 2);
	assert_true(back->has_digests);
	assert_int_equal(chain_commit(back, err, sizeof(err)), 0);
	assert_int_equal(back->gen, 3);
	assert_true(present(f->dir, "chain.0000000003.json"));
	/* A new chain (a Full snapshot's: generation 0 in memory) still goes past chain.json's. */
	assert_int_equal(chain_settle(f->dir, err, sizeof(err)), 0);
	sample_chain(c, f->dir, 1);
	assert_int_equal(chain_commit(c, err, sizeof(err)), 0);
	assert_int_equal(c->gen, 4);
	assert_int_equal(chain_load(f->dir, back, err, sizeof(err)), 0);
	assert_int_equal(back->gen, 4);
	assert_int_equal(back->nr_layers, 1);
	/* A second settle with nothing valid removes nothing. */
	snprintf(p, sizeof(p), "%s/%s", f->dir, CHAIN_FILE);
	write_file(p, "{", 1);
	snprintf(p, sizeof(p), "%s/chain.0000000004.json", f->dir);
	write_file(p, "{", 1);
	assert_int_equal(chain_settle(f->dir, err, sizeof(err)), -EINVAL);
	assert_true(present(f->dir, "mem-0") && present(f->dir, "chain.0000000004.json"));
	free(back);
	free(c);
}

/* The tree digest: a file's holes and written zeros digest alike; memory and file agree. */
static void test_digest(void **state)
{
	struct fx *f = *state;
	uint8_t zero[32], a[32], b[32];
	uint8_t *buf = calloc(1, 3 * DIGEST_CHUNK + 100);
	assert_non_null(buf);
	assert_int_equal(SHA256(buf, DIGEST_CHUNK, zero) != NULL, 1);
	assert_memory_equal(zero, digest_zero_chunk, 32);
	buf[DIGEST_CHUNK + 5] = 7;
	buf[3 * DIGEST_CHUNK + 99] = 9;
	size_t len = 3 * DIGEST_CHUNK + 100;
	assert_int_equal(digest_buf(buf, len, a), 0);
	/* The same bytes as a sparse file (chunks 0 and 2 holes), then written out in full. */
	snprintf(f->path, sizeof(f->path), "%s/sparse", f->dir);
	int fd = open(f->path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)len), 0);
	assert_int_equal(pwrite(fd, buf + DIGEST_CHUNK, 4096, DIGEST_CHUNK), 4096);
	assert_int_equal(pwrite(fd, buf + 3 * DIGEST_CHUNK, 100, 3 * DIGEST_CHUNK), 100);
	assert_int_equal(digest_fd(fd, b), 0);
	assert_memory_equal(a, b, 32);
	assert_int_equal(pwrite(fd, buf, len, 0), (ssize_t)len);
	assert_int_equal(digest_fd(fd, b), 0);
	assert_memory_equal(a, b, 32);
	/* One byte anywhere, or one byte more, changes it. */
	assert_int_equal(pwrite(fd, "\1", 1, 2 * DIGEST_CHUNK + 17), 1);
	assert_int_equal(digest_fd(fd, b), 0);
	assert_memory_not_equal(a, b, 32);
	assert_int_equal(digest_buf(buf, len - 1, b), 0);
	assert_memory_not_equal(a, b, 32);
	close(fd);
	/* Hex: lower case only, exactly 64 digits. */
	char hex[DIGEST_HEX_LEN];
	digest_hex(a, hex);
	assert_int_equal(strlen(hex), 64);
	assert_int_equal(digest_unhex(hex, b), 0);
	assert_memory_equal(a, b, 32);
	hex[3] = 'G';
	assert_int_equal(digest_unhex(hex, b), -EINVAL);
	hex[3] = 'A';
	assert_int_equal(digest_unhex(hex, b), -EINVAL);
	assert_int_equal(digest_unhex("00", b), -EINVAL);
	/* The disk layers a machine description names, and their maps; hostile names refused. */
	char names[8][64];
	int n = 0;
	static const char cfg[] =
	    "{\"format\":1,\"disks\":[{\"size\":1,\"layers\":[\"disk0-000001-l0.ovl\","
	    "\"disk0-000002.ovl\"]},{\"size\":2,\"layers\":[]}]}";
	assert_int_equal(digest_config_files(cfg, strlen(cfg), names, 8, &n), 0);
	assert_int_equal(n, 4);
	assert_string_equal(names[1], "disk0-000001-l0.ovl.map");
	assert_string_equal(names[2], "disk0-000002.ovl");
	assert_int_equal(digest_config_files(cfg, strlen(cfg), names, 3, &n), -E2BIG);
	static const char bad[] = "{\"disks\":[{\"layers\":[\"../etc/passwd\"]}]}";
	assert_int_equal(digest_config_files(bad, strlen(bad), names, 8, &n), -EINVAL);
	static const char none[] = "{\"fixture\":true}";
	assert_int_equal(digest_config_files(none, strlen(none), names, 8, &n), 0);
	assert_int_equal(n, 0);
	free(buf);
}

/* ---- extent writes ---- */

struct progress {
	int calls;
	uint64_t done, total;
};

static void on_progress(void *opaque, uint64_t done, uint64_t total)
{
	struct progress *p = opaque;
	assert_true(done >= p->done);
	assert_true(done <= total);
	p->calls++;
	p->done = done;
	p->total = total;
}

/*
 * Writes `n` extents of `buf` with method m into a new file; returns layer_write_extents' result.
 */
static int write_with(const char *path, enum write_method m, uint8_t *buf, size_t buf_len,
		      const struct write_extent *ext, size_t n, struct progress *pr)
{
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	memset(pr, 0, sizeof(*pr));
	int r = layer_write_extents(fd, m, buf, buf_len, ext, n, on_progress, pr);
	close(fd);
	return r;
}

/* Extents over a staging buffer, with the bytes they hold and the file they make. */
struct extent_job {
	uint8_t *buf;
	size_t buf_len;
	const struct write_extent *ext;
	size_t n;
	uint64_t total, file_len;
};

/*
 * Writes the job to `path` with method m; on success checks the progress calls and returns the
 * file's bytes in *out (file_len of them). 0 or the writer's -errno.
 */
static int write_and_read(const char *path, enum write_method m, const struct extent_job *j,
			  uint8_t **out)
{
	struct progress pr;
	int r = write_with(path, m, j->buf, j->buf_len, j->ext, j->n, &pr);
	if (r)
		return r;
	assert_true(pr.calls > 0);
	assert_int_equal(pr.done, j->total);
	assert_int_equal(pr.total, j->total);
	size_t len;
	*out = read_all(path, &len);
	assert_int_equal(len, j->file_len);
	return 0;
}

static void run_extents(struct fx *f, size_t buf_len, size_t nscatter, uint64_t seed)
{
	uint8_t *buf = malloc(buf_len);
	assert_non_null(buf);
	for (size_t i = 0; i < buf_len; i += 8) {
		uint64_t v = rnd(&seed);
		memcpy(buf + i, &v, buf_len - i < 8 ? buf_len - i : 8);
	}
	/* Non-overlapping extents at scattered, unaligned offsets, then one > 1 MiB, one empty. */
	size_t n = nscatter + 2;
	struct write_extent *ext = calloc(n, sizeof(*ext));
	assert_non_null(ext);
	uint64_t off = 0, total = 0, file_len = 0;
	for (size_t i = 0; i < nscatter; i++) {
		ext[i].len = 1 + rnd(&seed) % 20000;
		ext[i].file_off = off + rnd(&seed) % 9000;
		ext[i].buf_off = rnd(&seed) % (buf_len - ext[i].len + 1);
		off = ext[i].file_off + ext[i].len;
	}
	ext[nscatter].len = buf_len - 4097; /* split into pieces of at most 1 MiB */
	ext[nscatter].buf_off = 4097;
	ext[nscatter].file_off = off + 12345;
	ext[nscatter + 1] = (struct write_extent){off + 100, 0, 0};
	/* Shuffle so the file offsets are not in order. */
	for (size_t i = n - 1; i > 0; i--) {
		size_t j = (size_t)(rnd(&seed) % (i + 1));
		struct write_extent t = ext[i];
		ext[i] = ext[j];
		ext[j] = t;
	}
	for (size_t i = 0; i < n; i++) {
		total += ext[i].len;
		if (ext[i].len && ext[i].file_off + ext[i].len > file_len)
			file_len = ext[i].file_off + ext[i].len;
	}
	uint8_t *want = calloc(1, file_len);
	assert_non_null(want);
	for (size_t i = 0; i < n; i++)
		memcpy(want + ext[i].file_off, buf + ext[i].buf_off, ext[i].len);

	char pa[160], pb[160];
	snprintf(pa, sizeof(pa), "%s/pwrite.layer", f->dir);
	snprintf(pb, sizeof(pb), "%s/uring.layer", f->dir);
	const struct extent_job job = {buf, buf_len, ext, n, total, file_len};
	uint8_t *a = NULL, *b = NULL;
	assert_int_equal(write_and_read(pa, WRITE_PWRITE, &job, &a), 0);
	assert_memory_equal(a, want, file_len);

	int r = write_and_read(pb, WRITE_URING, &job, &b);
	bool compared = false;
	if (r != -ENOSYS && r != -EPERM) {
		assert_int_equal(r, 0);
		assert_memory_equal(b, a, file_len);
		free(b);
		compared = true;
		/* One ring made beforehand (the sandbox's, under seccomp) for two files in turn. */
		struct layer_ring *lr = NULL;
		assert_int_equal(layer_ring_new(&lr), 0);
		for (int k = 0; k < 2; k++) {
			int fd = open(pb, O_RDWR | O_CREAT | O_TRUNC, 0600);
			assert_true(fd >= 0);
			struct progress pr = {0};
			assert_int_equal(layer_write_extents_ring(lr, fd, WRITE_URING, buf, buf_len,
								  ext, n, on_progress, &pr),
					 0);
			close(fd);
			assert_int_equal(pr.done, total);
			size_t len;
			b = read_all(pb, &len);
			assert_int_equal(len, file_len);
			assert_memory_equal(b, a, file_len);
			free(b);
			unlink(pb);
		}
		layer_ring_free(lr);
	}
	free(a);
	unlink(pa);
	unlink(pb);
	free(want);
	free(ext);
	free(buf);
	if (!compared) {
		/* The pwrite half passed; report the io_uring half as skipped, not as passed. */
		print_message("io_uring unavailable (%s): WRITE_URING not compared\n",
			      strerror(-r));
		skip();
	}
}

/* Two buffer sizes: 2 MiB, and 16 MiB (16 pieces of 1 MiB for the big extent, 300 extents). */
static void test_layer_write_small_buffer(void **state)
{
	run_extents(*state, 2u << 20, 150, 0x1111);
}

static void test_layer_write_large_buffer(void **state)
{
	run_extents(*state, 16u << 20, 300, 0x2222);
}

static void test_layer_write_einval(void **state)
{
	struct fx *f = *state;
	const size_t buf_len = 65536;
	uint8_t *buf = calloc(1, buf_len);
	assert_non_null(buf);
	const struct write_extent bad[][2] = {
	    {{0, 0, 4096}, {0, buf_len + 1, 0}},
	    {{0, 0, 4096}, {8192, buf_len - 10, 11}},
	    {{0, 0, 4096}, {8192, 0, buf_len + 1}},
	    {{0, 0, 4096}, {8192, UINT64_MAX, 2}},
	    {{0, 0, 4096}, {8192, 4096, UINT64_MAX - 4095}},
	    {{0, 0, 4096}, {8192, buf_len, 1}},
	};
	char p[160];
	snprintf(p, sizeof(p), "%s/einval.layer", f->dir);
	int no_uring = 0;
	for (int m = WRITE_URING; m <= WRITE_PWRITE; m++) {
		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			struct progress pr;
			int r = write_with(p, (enum write_method)m, buf, buf_len, bad[i], 2, &pr);
			if (r != -EINVAL)
				fail_msg("method %d case %zu: r=%d", m, i, r);
			struct stat st;
			assert_int_equal(stat(p, &st), 0);
			assert_int_equal(st.st_size, 0); /* checked before anything is written */
			assert_int_equal(pr.calls, 0);
		}
		/* The edges that are fine: an empty extent at the end, one that ends at buf_len. */
		const struct write_extent edge[] = {{0, buf_len, 0}, {100, buf_len - 7, 7}};
		struct progress pr;
		int r = write_with(p, (enum write_method)m, buf, buf_len, edge, 2, &pr);
		if (m == WRITE_URING && (r == -ENOSYS || r == -EPERM)) {
			no_uring = r;
			continue;
		}
		assert_int_equal(r, 0);
		assert_int_equal(pr.done, 7);
		/* No extents at all. */
		assert_int_equal(write_with(p, (enum write_method)m, buf, buf_len, NULL, 0, &pr),
				 0);
	}
	unlink(p);
	free(buf);
	if (no_uring) {
		/* The refusals and the pwrite edges passed; the io_uring edges were not run. */
		print_message("io_uring unavailable (%s): WRITE_URING edges not checked\n",
			      strerror(-no_uring));
		skip();
	}
}

/* Writes beneath a directory fd never go through a link; names from a chain are plain. */
static void test_dirfd_io(void **state)
{
	struct fx *f = *state;
	char canary[160], link[160], err[256];
	snprintf(canary, sizeof(canary), "%s/canary", f->dir);
	snprintf(link, sizeof(link), "%s/.mem-000001.tmp", f->dir);
	FILE *c = fopen(canary, "w");
	assert_non_null(c);
	fputs("keep me\n", c);
	fclose(c);
	assert_int_equal(symlink(canary, link), 0);
	int dfd = dirfd_open_dir(f->dir, false, err, sizeof(err));
	assert_true(dfd >= 0);
	/* Reading through the link is refused; creating replaces the link by a file of ours. */
	assert_int_equal(dirfd_open(dfd, ".mem-000001.tmp", O_RDONLY), -ELOOP);
	int fd = dirfd_create(dfd, ".mem-000001.tmp", O_WRONLY, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "x", 1), 1);
	close(fd);
	struct stat st;
	assert_int_equal(lstat(link, &st), 0);
	assert_true(S_ISREG(st.st_mode));
	assert_int_equal(stat(canary, &st), 0);
	assert_int_equal(st.st_size, 8);
	assert_int_equal(dirfd_rename(dfd, ".mem-000001.tmp", "mem-000001"), 0);
	/* The jail's way: create only a new name, rename without replacing, never unlink. */
	assert_int_equal(dirfd_create_new(dfd, "mem-000001", O_WRONLY, 0600), -EEXIST);
	char tmp[96];
	fd = dirfd_create_tmp(dfd, "mem-000001", tmp, sizeof(tmp), O_WRONLY, 0600);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(strncmp(tmp, ".mem-000001.", 12), 0);
	assert_non_null(strstr(tmp, ".tmp"));
	assert_int_equal(dirfd_rename_noreplace(dfd, tmp, "mem-000001"), -EEXIST);
	assert_int_equal(fstatat(dfd, "mem-000001", &st, 0), 0); /* both names still there */
	assert_int_equal(dirfd_rename_noreplace(dfd, tmp, "mem-000002"), 0);
	assert_int_equal(dirfd_unlink(dfd, "mem-000002"), 0);
	assert_int_equal(dirfd_create(dfd, "../escape", O_WRONLY, 0600), -EINVAL);
	assert_int_equal(dirfd_create(dfd, "..", O_WRONLY, 0600), -EINVAL);
	assert_int_equal(dirfd_unlink(dfd, "mem-000001"), 0);
	close(dfd);
	/* Names a chain may use. */
	assert_true(dirfd_plain_name("mem-000001"));
	assert_false(dirfd_plain_name(""));
	assert_false(dirfd_plain_name(".."));
	assert_false(dirfd_plain_name(".mem-000001.tmp"));
	assert_false(dirfd_plain_name("/etc/shadow"));
	assert_false(dirfd_plain_name("a/b"));
	assert_false(dirfd_plain_name("a b"));
	/* A directory others may write to is refused, in one line naming it. */
	assert_int_equal(chmod(f->dir, 0777), 0);
	assert_int_equal(dirfd_open_dir(f->dir, false, err, sizeof(err)), -EPERM);
	assert_non_null(strstr(err, "writable by others"));
	assert_null(strchr(err, '\n'));
	assert_int_equal(chmod(f->dir, 0700), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_state_read_file, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_mem_layer_open, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_chain_commit_load, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_chain_generations_hostile, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_chain_settle, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_digest, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_layer_write_small_buffer, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_layer_write_large_buffer, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_layer_write_einval, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_dirfd_io, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
