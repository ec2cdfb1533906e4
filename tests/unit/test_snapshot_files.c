/* Unit tests of the snapshot file parsers (state file, memory layer header, chain.json): round
 * trips, hostile input, mutation loops. */
#include <inttypes.h>
#include <stdbool.h>

#include "helpers.h"
#include "common/byteorder.h"
#include "common/crc32.h"
#include "snapshot/chain.h"
#include "snapshot/mem_layer.h"
#include "snapshot/state_file.h"

#define MUTATIONS 4000

/* Recomputes body length, body CRC and header CRC of a state image of `len` bytes. */
static void state_fix(uint8_t *buf, size_t len)
{
	put_le64(buf + 16, len - STATE_HDR_SIZE);
	put_le32(buf + 24, crc32_update(0, buf + STATE_HDR_SIZE, len - STATE_HDR_SIZE));
	put_le32(buf + 28, crc32_update(0, buf, 28));
}

static void state_fix_hdr(uint8_t *buf)
{
	put_le32(buf + 28, crc32_update(0, buf, 28));
}

/* A state image with sections of assorted types and lengths (0, odd, a multiple of 8). */
static void build_state(struct state_buf *b)
{
	static const char cfg[] = "{\"mem_size\":268435456,\"vcpus\":2,\"disks\":[]}";
	uint8_t regs[200];
	for (size_t i = 0; i < sizeof(regs); i++)
		regs[i] = (uint8_t)(i * 3 + 1);
	state_buf_init(b);
	state_put(b, SEC_CONFIG, 0, cfg, sizeof(cfg) - 1);
	state_put(b, SEC_CLOCK, 0, regs, 48);
	for (uint32_t v = 0; v < 3; v++) {
		state_put(b, SEC_VCPU_REGS, v, regs, 144);
		state_put(b, SEC_VCPU_MSRS, v, regs, 13 + v);
	}
	state_put(b, SEC_PIT, 0, NULL, 0);
	state_put(b, SEC_DEVICE, 7, regs, 1);
	assert_int_equal(b->err, 0);
	assert_int_equal(state_finish(b), 0);
}

static void test_state_round_trip(void **st)
{
	(void)st;
	struct state_buf b;
	build_state(&b);
	/* 32 header + 10 sections of 16 + padded payloads */
	size_t want = STATE_HDR_SIZE + 10 * 16 + 48 + 48 + 3 * 144 + (16 + 16 + 16) + 0 + 8;
	assert_int_equal(b.len, want);
	assert_memory_equal(b.p, STATE_MAGIC, 8);

	struct state_section_ref *s;
	size_t n;
	char err[256] = "";
	assert_int_equal(state_parse(b.p, b.len, &s, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 10);
	const struct state_section_ref *c = state_find(s, n, SEC_CONFIG, 0);
	assert_non_null(c);
	assert_int_equal(c->len, 43);
	assert_memory_equal(c->payload, "{\"mem_size\"", 11);
	for (uint32_t v = 0; v < 3; v++) {
		const struct state_section_ref *m = state_find(s, n, SEC_VCPU_MSRS, v);
		assert_non_null(m);
		assert_int_equal(m->len, 13 + v);
		assert_int_equal(m->payload[0], 1);
		assert_int_equal(m->payload[12], 37);
		assert_int_equal(((uintptr_t)m->payload - (uintptr_t)b.p) % 8, 0);
	}
	const struct state_section_ref *pit = state_find(s, n, SEC_PIT, 0);
	assert_non_null(pit);
	assert_int_equal(pit->len, 0);
	const struct state_section_ref *dev = state_find(s, n, SEC_DEVICE, 7);
	assert_non_null(dev);
	assert_int_equal(dev->len, 1);
	assert_null(state_find(s, n, SEC_VCPU_REGS, 3));
	assert_null(state_find(s, n, SEC_DEVICE, 0));
	assert_null(state_find(s, n, SEC_IRQCHIP, 0));
	assert_null(state_find(s, 0, SEC_CONFIG, 0));
	free(s);

	/* A file with no sections is valid and empty. */
	struct state_buf e;
	state_buf_init(&e);
	assert_int_equal(state_finish(&e), 0);
	assert_int_equal(e.len, STATE_HDR_SIZE);
	assert_int_equal(state_parse(e.p, e.len, &s, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 0);
	free(s);
	state_buf_free(&e);
	state_buf_free(&b);
}

/* More sections than the parser's first array holds (64) and a section of exactly the cap. */
static void test_state_many_sections(void **st)
{
	(void)st;
	struct state_buf b;
	state_buf_init(&b);
	for (uint32_t i = 0; i < 300; i++)
		state_put(&b, SEC_DEVICE, i, &i, sizeof(i));
	uint8_t *big = calloc(1, STATE_MAX_SECTION);
	assert_non_null(big);
	big[STATE_MAX_SECTION - 1] = 0xab;
	state_put(&b, SEC_VCPU_XSAVE, 0, big, STATE_MAX_SECTION);
	assert_int_equal(state_finish(&b), 0);
	struct state_section_ref *s;
	size_t n;
	char err[256] = "";
	assert_int_equal(state_parse(b.p, b.len, &s, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 301);
	for (uint32_t i = 0; i < 300; i++) {
		const struct state_section_ref *r = state_find(s, n, SEC_DEVICE, i);
		assert_non_null(r);
		assert_int_equal(get_le32(r->payload), i);
	}
	const struct state_section_ref *x = state_find(s, n, SEC_VCPU_XSAVE, 0);
	assert_non_null(x);
	assert_int_equal(x->len, STATE_MAX_SECTION);
	assert_int_equal(x->payload[STATE_MAX_SECTION - 1], 0xab);
	free(s);
	free(big);
	state_buf_free(&b);
}

/* The writer refuses a section over the cap and a body over the cap; the first error sticks. */
static void test_state_writer_caps(void **st)
{
	(void)st;
	struct state_buf b;
	state_buf_init(&b);
	uint8_t *big = calloc(1, STATE_MAX_SECTION + 1);
	assert_non_null(big);
	state_put(&b, SEC_DEVICE, 0, big, STATE_MAX_SECTION + 1);
	assert_int_equal(b.err, -E2BIG);
	size_t len = b.len;
	state_put(&b, SEC_DEVICE, 1, big, 8); /* ignored after the error */
	assert_int_equal(b.len, len);
	assert_int_equal(state_finish(&b), -E2BIG);
	state_buf_free(&b);

	state_buf_init(&b);
	int i;
	for (i = 0; i < 20 && !b.err; i++)
		state_put(&b, SEC_DEVICE, (uint32_t)i, big, STATE_MAX_SECTION);
	/* 15 sections of 1 MiB + 16 fit in 16 MiB; the 16th does not. */
	assert_int_equal(i, 16);
	assert_int_equal(b.err, -E2BIG);
	assert_true(b.len <= STATE_HDR_SIZE + (size_t)STATE_MAX_BODY);
	assert_int_equal(state_finish(&b), -E2BIG);
	state_buf_free(&b);
	free(big);
}

/* Parses a private exact-size copy (so ASan sees any read past it); returns r, fills err. */
static int parse_copy(const uint8_t *img, size_t len, char *err, size_t errlen)
{
	uint8_t *p = malloc(len ? len : 1);
	assert_non_null(p);
	memcpy(p, img, len);
	struct state_section_ref *s = NULL;
	size_t n = 99;
	err[0] = '\0';
	int r = state_parse(p, len, &s, &n, err, errlen);
	if (r == 0) {
		for (size_t i = 0; i < n; i++) {
			assert_true(s[i].type > 0 && s[i].type < SEC_MAX);
			assert_true(s[i].payload >= p + STATE_HDR_SIZE);
			assert_true(s[i].payload + s[i].len <= p + len);
			assert_true(s[i].len <= STATE_MAX_SECTION);
		}
		free(s);
	} else {
		assert_null(s);
		assert_int_equal(n, 0);
	}
	free(p);
	return r;
}

static void expect_state_error(const uint8_t *img, size_t len, const char *needle)
{
	char err[256];
	assert_int_equal(parse_copy(img, len, err, sizeof(err)), -EINVAL);
	assert_one_line_error(err, NULL);
	if (!strstr(err, needle))
		fail_msg("error \"%s\" does not mention \"%s\"", err, needle);
}

static void test_state_bad_files(void **st)
{
	(void)st;
	struct state_buf b;
	build_state(&b);
	const size_t len = b.len;
	uint8_t *img = malloc(len + 64);
	assert_non_null(img);
	char err[256];

	/* Every truncation fails. */
	for (size_t l = 0; l < len; l++) {
		assert_int_equal(parse_copy(b.p, l, err, sizeof(err)), -EINVAL);
		assert_one_line_error(err, NULL);
	}
	expect_state_error(b.p, 10, "truncated");
	expect_state_error(b.p, len - 8, "truncated");

	/* Trailing bytes. */
	memcpy(img, b.p, len);
	memset(img + len, 0, 64);
	expect_state_error(img, len + 8, "trailing");

#define RESET() memcpy(img, b.p, len)
	RESET();
	img[0] = 'X';
	expect_state_error(img, len, "bad magic");

	RESET();
	put_le32(img + 8, 3);
	expect_state_error(img, len, "header is corrupt"); /* CRC catches it first */
	state_fix_hdr(img);
	expect_state_error(img, len, "version 3 is not supported");
	RESET();
	put_le32(img + 8, 0);
	state_fix_hdr(img);
	expect_state_error(img, len, "version 0 is not supported");

	RESET();
	put_le32(img + 12, 64);
	state_fix_hdr(img);
	expect_state_error(img, len, "header size");

	RESET();
	put_le64(img + 16, (uint64_t)STATE_MAX_BODY + 1);
	state_fix_hdr(img);
	expect_state_error(img, len, "too large");
	RESET();
	put_le64(img + 16, UINT64_MAX);
	state_fix_hdr(img);
	expect_state_error(img, len, "too large");
	RESET();
	put_le64(img + 16, len - STATE_HDR_SIZE + 8);
	state_fix_hdr(img);
	expect_state_error(img, len, "truncated");

	/* A flipped body bit: body CRC. */
	RESET();
	img[len - 100] ^= 0x10;
	expect_state_error(img, len, "corrupt (CRC mismatch)");

	/* Sections with consistent CRCs but bad contents. */
	RESET();
	put_le32(img + STATE_HDR_SIZE, 0);
	state_fix(img, len);
	expect_state_error(img, len, "unknown section type 0");
	RESET();
	put_le32(img + STATE_HDR_SIZE, SEC_MAX);
	state_fix(img, len);
	expect_state_error(img, len, "unknown section type");
	RESET();
	put_le32(img + STATE_HDR_SIZE, 0xffffffffu);
	state_fix(img, len);
	expect_state_error(img, len, "unknown section type 4294967295");

	static const uint32_t bad_lens[] = {STATE_MAX_SECTION + 1, 0xffffffffu, 0xfffffff9u,
					    1000000, 10000};
	for (size_t i = 0; i < sizeof(bad_lens) / sizeof(bad_lens[0]); i++) {
		RESET();
		put_le32(img + STATE_HDR_SIZE + 8, bad_lens[i]);
		state_fix(img, len);
		expect_state_error(img, len, "bad length");
	}
	/* The last section's length reaching past the end by one padded word. */
	RESET();
	put_le32(img + len - 16 - 8 + 8, 9);
	state_fix(img, len);
	expect_state_error(img, len, "bad length");

	/* A body shorter than one section header. */
	RESET();
	state_fix(img, STATE_HDR_SIZE + 8);
	expect_state_error(img, STATE_HDR_SIZE + 8, "section header past the end");

	/* A body cut at a section boundary, header re-sealed: valid, fewer sections. */
	RESET();
	state_fix(img, len - 24);
	struct state_section_ref *s;
	size_t n;
	assert_int_equal(state_parse(img, len - 24, &s, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 9);
	free(s);
#undef RESET
	free(img);
	state_buf_free(&b);
}

/* Flip, overwrite and truncate bytes of a valid image; re-seal the CRCs half of the time. */
static void test_state_mutations(void **st)
{
	(void)st;
	struct state_buf b;
	build_state(&b);
	const size_t len = b.len;
	uint8_t *img = malloc(len);
	assert_non_null(img);
	uint64_t seed = 0x5eed0005;
	struct mutation_tally m = {0};
	char err[256];
	for (int it = 0; it < MUTATIONS; it++) {
		memcpy(img, b.p, len);
		size_t l = len;
		uint64_t how = rnd(&seed);
		int flips = 1 + (int)(rnd(&seed) % 4);
		for (int k = 0; k < flips; k++) {
			size_t at = (size_t)(rnd(&seed) % len);
			switch (rnd(&seed) % 4) {
			case 0:
				img[at] ^= (uint8_t)(1u << (rnd(&seed) % 8));
				break;
			case 1:
				img[at] = (uint8_t)rnd(&seed);
				break;
			case 2: { /* aim at a length field: a section header starts at 32 + 8k */
				at = STATE_HDR_SIZE + 8 * (size_t)(rnd(&seed) % ((len - 40) / 8)) +
				     8;
				uint32_t v = (uint32_t)rnd(&seed);
				put_le32(img + at, v >> (rnd(&seed) % 32));
				break;
			}
			default:
				img[at] = 0xff;
				break;
			}
		}
		if (how & 1)
			l = (size_t)(rnd(&seed) % (len + 1));
		if ((how & 6) && l >= STATE_HDR_SIZE)
			state_fix(img, l);
		mutation_tally_add(&m, parse_copy(img, l, err, sizeof(err)), err);
	}
	mutation_tally_report(&m, "state");
	free(img);
	state_buf_free(&b);
}

/* ---- memory layer header ---- */

static void test_mem_layout(void **st)
{
	(void)st;
	struct mem_layer_info li;
	memset(&li, 0, sizeof(li));
	mem_layer_layout(&li, 4096);
	assert_int_equal(li.nr_pages, 1);
	assert_int_equal(li.bitmap_off, 4096);
	assert_int_equal(li.bitmap_len, 8);
	assert_int_equal(li.data_off, 8192);
	assert_int_equal(mem_layer_file_size(&li), 12288);

	mem_layer_layout(&li, 64 * 4096);
	assert_int_equal(li.nr_pages, 64);
	assert_int_equal(li.bitmap_len, 8);
	mem_layer_layout(&li, 65 * 4096);
	assert_int_equal(li.bitmap_len, 16);
	assert_int_equal(li.data_off, 8192);

	mem_layer_layout(&li, 1ULL << 30);
	assert_int_equal(li.nr_pages, 262144);
	assert_int_equal(li.bitmap_len, 32768);
	assert_int_equal(li.data_off, 4096 + 32768);
	assert_int_equal(mem_layer_file_size(&li), 4096 + 32768 + (1ULL << 30));

	/* A bitmap of exactly one page (32768 pages of RAM) and one a byte longer. */
	mem_layer_layout(&li, 32768ULL * 4096);
	assert_int_equal(li.bitmap_len, 4096);
	assert_int_equal(li.data_off, 8192);
	mem_layer_layout(&li, 32769ULL * 4096);
	assert_int_equal(li.bitmap_len, 4104);
	assert_int_equal(li.data_off, 12288);

	mem_layer_layout(&li, 1ULL << 40);
	assert_int_equal(li.nr_pages, 1ULL << 28);
	assert_int_equal(li.bitmap_len, 1ULL << 25);
	assert_int_equal(li.data_off, 4096 + (1ULL << 25));
}

static void sample_info(struct mem_layer_info *li)
{
	memset(li, 0, sizeof(*li));
	mem_layer_layout(li, 256ULL << 20);
	li->layer_id = 7;
	li->parent_id = 6;
	li->present = 1000;
	li->stored = 900;
	for (int i = 0; i < 16; i++)
		li->chain_id[i] = (uint8_t)(0xa0 + i);
	li->flags = MEM_LAYER_FULL;
	li->bitmap_crc = 0xdeadbeef;
}

static void test_mem_header_round_trip(void **st)
{
	(void)st;
	struct mem_layer_info li, out;
	sample_info(&li);
	uint8_t *hdr = malloc(MEM_LAYER_HDR);
	assert_non_null(hdr);
	mem_layer_header_build(&li, hdr);
	assert_memory_equal(hdr, MEM_LAYER_MAGIC, 8);
	char err[256] = "";
	memset(&out, 0x55, sizeof(out));
	assert_int_equal(mem_layer_header_parse(hdr, MEM_LAYER_HDR, &out, err, sizeof(err)), 0);
	assert_memory_equal(&out, &li, sizeof(li));
	/* A longer buffer (the header followed by a bitmap) parses the same. */
	free(hdr);
}

static void expect_hdr_error(const uint8_t *hdr, size_t len, const char *needle)
{
	uint8_t *p = malloc(len ? len : 1);
	assert_non_null(p);
	memcpy(p, hdr, len);
	struct mem_layer_info li;
	char err[256] = "";
	assert_int_equal(mem_layer_header_parse(p, len, &li, err, sizeof(err)), -EINVAL);
	free(p);
	assert_one_line_error(err, NULL);
	if (!strstr(err, needle))
		fail_msg("error \"%s\" does not mention \"%s\"", err, needle);
}

static void hdr_seal(uint8_t *hdr)
{
	put_le32(hdr + MEM_LAYER_HDR - 4, crc32_update(0, hdr, MEM_LAYER_HDR - 4));
}

static void test_mem_header_bad(void **st)
{
	(void)st;
	struct mem_layer_info li;
	sample_info(&li);
	uint8_t good[MEM_LAYER_HDR], h[MEM_LAYER_HDR];
	mem_layer_header_build(&li, good);

	expect_hdr_error(good, 0, "truncated");
	expect_hdr_error(good, 100, "truncated");
	expect_hdr_error(good, MEM_LAYER_HDR - 1, "truncated");

	memcpy(h, good, sizeof(h));
	memcpy(h, "COVESTAT", 8);
	expect_hdr_error(h, sizeof(h), "bad magic");

	memcpy(h, good, sizeof(h));
	h[2000] ^= 1; /* reserved bytes are covered too */
	expect_hdr_error(h, sizeof(h), "CRC mismatch");
	memcpy(h, good, sizeof(h));
	h[MEM_LAYER_HDR - 1] ^= 0x80;
	expect_hdr_error(h, sizeof(h), "CRC mismatch");

	memcpy(h, good, sizeof(h));
	put_le32(h + 8, 2);
	expect_hdr_error(h, sizeof(h), "CRC mismatch");
	hdr_seal(h);
	expect_hdr_error(h, sizeof(h), "version 2 is not supported");

	memcpy(h, good, sizeof(h));
	put_le32(h + 12, 65536);
	hdr_seal(h);
	expect_hdr_error(h, sizeof(h), "page size");

	static const uint64_t bad_ram[] = {0,
					   4095,
					   4097,
					   (256ULL << 20) + 512,
					   (1ULL << 40) + 4096,
					   UINT64_MAX,
					   UINT64_MAX & ~4095ULL};
	for (size_t i = 0; i < sizeof(bad_ram) / sizeof(bad_ram[0]); i++) {
		memcpy(h, good, sizeof(h));
		put_le64(h + 32, bad_ram[i]);
		hdr_seal(h);
		expect_hdr_error(h, sizeof(h), "RAM size");
	}
	/* RAM size changed alone: the offsets no longer match it. */
	memcpy(h, good, sizeof(h));
	put_le64(h + 32, 128ULL << 20);
	hdr_seal(h);
	expect_hdr_error(h, sizeof(h), "offsets");
	for (int field = 40; field <= 64; field += 8) {
		memcpy(h, good, sizeof(h));
		put_le64(h + field, get_le64(h + field) + 8);
		hdr_seal(h);
		expect_hdr_error(h, sizeof(h), "offsets");
		memcpy(h, good, sizeof(h));
		put_le64(h + field, 0);
		hdr_seal(h);
		expect_hdr_error(h, sizeof(h), "offsets");
	}

	memcpy(h, good, sizeof(h));
	put_le64(h + 72, li.nr_pages + 1);
	hdr_seal(h);
	expect_hdr_error(h, sizeof(h), "page counts");
	memcpy(h, good, sizeof(h));
	put_le64(h + 80, li.present + 1);
	hdr_seal(h);
	expect_hdr_error(h, sizeof(h), "page counts");
	memcpy(h, good, sizeof(h));
	put_le64(h + 72, UINT64_MAX);
	put_le64(h + 80, UINT64_MAX);
	hdr_seal(h);
	expect_hdr_error(h, sizeof(h), "page counts");

	/* Extremes that are valid: present = stored = every page; the largest RAM. */
	memcpy(h, good, sizeof(h));
	put_le64(h + 72, li.nr_pages);
	put_le64(h + 80, li.nr_pages);
	hdr_seal(h);
	char err[256];
	struct mem_layer_info o;
	assert_int_equal(mem_layer_header_parse(h, sizeof(h), &o, err, sizeof(err)), 0);
	memset(&li, 0, sizeof(li));
	mem_layer_layout(&li, 1ULL << 40);
	mem_layer_header_build(&li, h);
	assert_int_equal(mem_layer_header_parse(h, sizeof(h), &o, err, sizeof(err)), 0);
	assert_int_equal(o.nr_pages, 1ULL << 28);
}

static void test_mem_header_mutations(void **st)
{
	(void)st;
	struct mem_layer_info li;
	sample_info(&li);
	uint8_t good[MEM_LAYER_HDR];
	mem_layer_header_build(&li, good);
	uint64_t seed = 0x4d454d;
	struct mutation_tally m = {0};
	for (int it = 0; it < MUTATIONS; it++) {
		uint8_t *h = malloc(MEM_LAYER_HDR);
		assert_non_null(h);
		memcpy(h, good, MEM_LAYER_HDR);
		uint64_t how = rnd(&seed);
		int flips = 1 + (int)(rnd(&seed) % 4);
		for (int k = 0; k < flips; k++) {
			/* Mostly the 112 bytes of fields, sometimes anywhere. */
			size_t at = (size_t)(rnd(&seed) % (how & 8 ? MEM_LAYER_HDR : 112));
			if (rnd(&seed) & 1)
				h[at] ^= (uint8_t)(1u << (rnd(&seed) % 8));
			else
				h[at] = (uint8_t)rnd(&seed);
		}
		if (how & 6)
			hdr_seal(h);
		size_t l = MEM_LAYER_HDR;
		if ((how & 0x30) == 0x30) {
			l = (size_t)(rnd(&seed) % MEM_LAYER_HDR);
			uint8_t *t = malloc(l ? l : 1);
			assert_non_null(t);
			memcpy(t, h, l);
			free(h);
			h = t;
		}
		struct mem_layer_info o;
		char err[256] = "";
		int r = mem_layer_header_parse(h, l, &o, err, sizeof(err));
		if (mutation_tally_add(&m, r, err)) {
			assert_true(o.ram_size && o.ram_size % 4096 == 0 &&
				    o.ram_size <= (1ULL << 40));
			assert_int_equal(o.nr_pages, o.ram_size / 4096);
			assert_true(o.bitmap_len * 8 >= o.nr_pages);
			assert_true(o.data_off >= o.bitmap_off + o.bitmap_len);
			assert_true(o.present <= o.nr_pages && o.stored <= o.present);
		}
		free(h);
	}
	mutation_tally_report(&m, "memory header");
}

/* ---- chain.json ---- */

#define SHA_HEX	      "30e14955ebf1352266dc2ff8067e68104607e750abb9d3b36582b8af909fcb58"
#define SHA_HEX_UPPER "30E14955EBF1352266DC2FF8067E68104607E750ABB9D3B36582B8AF909FCB58"
#define CHAIN_ID      "00112233445566778899aabbccddeeff"
#define LAYER(id, parent, full, mem, state)                                                        \
	"{\"id\":" #id ",\"parent\":" #parent ",\"full\":" #full ",\"mem\":\"" mem                 \
	"\",\"state\":\"" state "\",\"present\":10,\"stored\":5,\"created_ns\":123}"
#define CHAIN(layers)                                                                              \
	"{\"format\":\"cove-chain\",\"version\":1,\"chain_id\":\"" CHAIN_ID                        \
	"\",\"ram_size\":268435456,\"layers\":[" layers "]}"

/* Parses from an exact-size copy without a terminating NUL. */
static int chain_parse_copy(const char *text, size_t len, struct chain *c, char *err, size_t errlen)
{
	char *p = malloc(len ? len : 1);
	assert_non_null(p);
	memcpy(p, text, len);
	err[0] = '\0';
	int r = chain_parse(p, len, c, err, errlen);
	free(p);
	return r;
}

static void test_chain_parse_valid(void **st)
{
	(void)st;
	static const char text[] = CHAIN(LAYER(1, 0, true, "mem-1", "state-1") "," LAYER(
	    2, 1, false, "mem-2", "state-2") "," LAYER(5, 2, false, "mem-5.layer", "state_5"));
	struct chain *c = calloc(1, sizeof(*c));
	assert_non_null(c);
	char err[256];
	assert_int_equal(chain_parse_copy(text, strlen(text), c, err, sizeof(err)), 0);
	assert_int_equal(c->nr_layers, 3);
	assert_int_equal(c->ram_size, 256ULL << 20);
	char hex[33];
	chain_id_hex(c->chain_id, hex);
	assert_string_equal(hex, CHAIN_ID);
	assert_int_equal(c->chain_id[15], 0xff);
	assert_true(c->layers[0].full);
	assert_int_equal(c->layers[0].id, 1);
	assert_int_equal(c->layers[0].parent, 0);
	assert_false(c->layers[1].full);
	assert_int_equal(c->layers[2].id, 5);
	assert_int_equal(c->layers[2].parent, 2);
	assert_string_equal(c->layers[2].mem, "mem-5.layer");
	assert_string_equal(c->layers[2].state, "state_5");
	assert_int_equal(c->layers[1].present, 10);
	assert_int_equal(c->layers[1].stored, 5);
	assert_int_equal(c->layers[1].created_ns, 123);
	assert_ptr_equal(chain_latest(c), &c->layers[2]);

	/* Upper-case hex, a 63-character name, an empty chain. */
	static const char t2[] =
	    "{\"format\":\"cove-chain\",\"version\":1,\"chain_id\":"
	    "\"00112233445566778899AABBCCDDEEFF\","
	    "\"ram_size\":4096,\"layers\":[" LAYER(
		9, 0, true, "123456789012345678901234567890123456789012345678901234567890123",
		"s") "]}";
	assert_int_equal(chain_parse_copy(t2, strlen(t2), c, err, sizeof(err)), 0);
	assert_int_equal(c->chain_id[10], 0xaa);
	assert_int_equal(strlen(c->layers[0].mem), 63);
	static const char t3[] = CHAIN("");
	assert_int_equal(chain_parse_copy(t3, strlen(t3), c, err, sizeof(err)), 0);
	assert_int_equal(c->nr_layers, 0);
	assert_null(chain_latest(c));
	free(c);
}

struct bad_case {
	const char *text;
	const char *needle;
};

static void expect_chain_cases(const struct bad_case *cases, size_t n)
{
	struct chain *c = calloc(1, sizeof(*c));
	assert_non_null(c);
	for (size_t i = 0; i < n; i++) {
		char err[256];
		int r = chain_parse_copy(cases[i].text, strlen(cases[i].text), c, err, sizeof(err));
		if (r != -EINVAL)
			fail_msg("case %zu: %s: r=%d (want -EINVAL)", i, cases[i].text, r);
		assert_one_line_error(err, NULL);
		if (!strstr(err, cases[i].needle))
			fail_msg("case %zu: error \"%s\" does not mention \"%s\"", i, err,
				 cases[i].needle);
	}
	free(c);
}

static void test_chain_parse_bad(void **st)
{
	(void)st;
	static const struct bad_case cases[] = {
	    {"", "not valid JSON"},
	    {"{", "not valid JSON"},
	    {"[]", "not a cove chain file"},
	    {"null", "not valid JSON"},
	    {CHAIN("") "x", "not valid JSON"},
	    {"{\"format\":\"cove-chain\",\"format\":\"cove-chain\",\"version\":1}",
	     "not valid JSON"},
	    {"{\"format\":\"cove-chainx\",\"version\":1}", "not a cove chain file"},
	    /* Found by fuzz_snapshot_files: jansson quotes the bad token, newline and all. */
	    {"{\"format\": \"cove-chain\", \"chain_id\": \"00Q\\\n\x01@`\"}", "not valid JSON"},
	    {"{\"format\":1,\"version\":1}", "not a cove chain file"},
	    {"{\"version\":1}", "not a cove chain file"},
	    {"{\"format\":\"cove-chain\"}", "not a cove chain file"},
	    {"{\"format\":\"cove-chain\",\"version\":\"1\"}", "not a cove chain file"},
	    {"{\"format\":\"cove-chain\",\"version\":-1}", "not a cove chain file"},
	    {"{\"format\":\"cove-chain\",\"version\":1.0}", "not a cove chain file"},
	    {"{\"format\":\"cove-chain\",\"version\":3,\"chain_id\":\"" CHAIN_ID
	     "\",\"ram_size\":4096,\"layers\":[]}",
	     "version 3 is not supported"},
	    /* Version 2: a generation and a digest of every layer's files. */
	    {"{\"format\":\"cove-chain\",\"version\":2,\"chain_id\":\"" CHAIN_ID
	     "\",\"ram_size\":4096,\"layers\":[],\"sha256\":{}}",
	     "generation"},
	    {"{\"format\":\"cove-chain\",\"version\":2,\"generation\":0,\"chain_id\":\"" CHAIN_ID
	     "\",\"ram_size\":4096,\"layers\":[],\"sha256\":{}}",
	     "generation"},
	    {"{\"format\":\"cove-chain\",\"version\":2,\"generation\":10000000000,"
	     "\"chain_id\":\"" CHAIN_ID "\",\"ram_size\":4096,\"layers\":[],\"sha256\":{}}",
	     "generation"},
	    {"{\"format\":\"cove-chain\",\"version\":2,\"generation\":1,\"chain_id\":\"" CHAIN_ID
	     "\",\"ram_size\":4096,\"layers\":[]}",
	     "sha256 is missing"},
	    {"{\"format\":\"cove-chain\",\"version\":2,\"generation\":1,\"chain_id\":\"" CHAIN_ID
	     "\",\"ram_size\":4096,\"layers\":[],\"sha256\":{\"m\":\"00\"}}",
	     "sha256 entry is malformed"},
	    {"{\"format\":\"cove-chain\",\"version\":2,\"generation\":1,\"chain_id\":\"" CHAIN_ID
	     "\",\"ram_size\":4096,\"layers\":[],\"sha256\":{\"../m\":\"" SHA_HEX "\"}}",
	     "sha256 entry is malformed"},
	    {"{\"format\":\"cove-chain\",\"version\":2,\"generation\":1,\"chain_id\":\"" CHAIN_ID
	     "\",\"ram_size\":4096,\"layers\":[],\"sha256\":{\"m\":\"" SHA_HEX_UPPER "\"}}",
	     "sha256 entry is malformed"},
	    {"{\"format\":\"cove-chain\",\"version\":2,\"generation\":1,\"chain_id\":\"" CHAIN_ID
	     "\",\"ram_size\":4096,\"layers\":[" LAYER(1, 0, true, "m",
						       "s") "],\"sha256\":{\"m\":\"" SHA_HEX "\"}}",
	     "layer 0 has no sha256"},
	    {"{\"format\":\"cove-chain\",\"version\":0}", "version 0 is not supported"},
	    /* chain_id */
	    {"{\"format\":\"cove-chain\",\"version\":1,\"ram_size\":4096,\"layers\":[]}",
	     "chain_id"},
	    {"{\"format\":\"cove-chain\",\"version\":1,\"chain_id\":\"0011\",\"ram_size\":4096,"
	     "\"layers\":[]}",
	     "chain_id"},
	    {"{\"format\":\"cove-chain\",\"version\":1,\"chain_id\":\"" CHAIN_ID
	     "00\",\"ram_size\":4096,\"layers\":[]}",
	     "chain_id"},
	    {"{\"format\":\"cove-chain\",\"version\":1,\"chain_id\":"
	     "\"zz112233445566778899aabbccddeeff\",\"ram_size\":4096,\"layers\":[]}",
	     "chain_id"},
	    {"{\"format\":\"cove-chain\",\"version\":1,\"chain_id\":"
	     "\"00112233445566778899aabbccddeegg\",\"ram_size\":4096,\"layers\":[]}",
	     "chain_id"},
	    {"{\"format\":\"cove-chain\",\"version\":1,\"chain_id\":12,\"ram_size\":4096,"
	     "\"layers\":[]}",
	     "chain_id"},
	    /* ram_size, layers */
	    {"{\"format\":\"cove-chain\",\"version\":1,\"chain_id\":\"" CHAIN_ID
	     "\",\"layers\":[]}",
	     "ram_size"},
	    {"{\"format\":\"cove-chain\",\"version\":1,\"chain_id\":\"" CHAIN_ID
	     "\",\"ram_size\":-4096,\"layers\":[]}",
	     "ram_size"},
	    {"{\"format\":\"cove-chain\",\"version\":1,\"chain_id\":\"" CHAIN_ID
	     "\",\"ram_size\":\"4096\",\"layers\":[]}",
	     "ram_size"},
	    {"{\"format\":\"cove-chain\",\"version\":1,\"chain_id\":\"" CHAIN_ID
	     "\",\"ram_size\":4096}",
	     "layers"},
	    {"{\"format\":\"cove-chain\",\"version\":1,\"chain_id\":\"" CHAIN_ID
	     "\",\"ram_size\":4096,\"layers\":{}}",
	     "layers"},
	    /* layer fields */
	    {CHAIN("1"), "layer 0 is malformed"},
	    {CHAIN("[]"), "layer 0 is malformed"},
	    {CHAIN("{}"), "layer 0 is malformed"},
	    {CHAIN("{\"id\":1,\"parent\":0,\"full\":true,\"mem\":\"m\",\"state\":\"s\","
		   "\"present\":1,\"stored\":1}"),
	     "layer 0 is malformed"},
	    {CHAIN("{\"id\":1,\"parent\":0,\"full\":\"true\",\"mem\":\"m\",\"state\":\"s\","
		   "\"present\":1,\"stored\":1,\"created_ns\":1}"),
	     "layer 0 is malformed"},
	    {CHAIN("{\"id\":1,\"parent\":0,\"full\":1,\"mem\":\"m\",\"state\":\"s\","
		   "\"present\":1,\"stored\":1,\"created_ns\":1}"),
	     "layer 0 is malformed"},
	    {CHAIN("{\"id\":\"1\",\"parent\":0,\"full\":true,\"mem\":\"m\",\"state\":\"s\","
		   "\"present\":1,\"stored\":1,\"created_ns\":1}"),
	     "layer 0 is malformed"},
	    {CHAIN("{\"id\":1,\"parent\":0,\"full\":true,\"mem\":7,\"state\":\"s\","
		   "\"present\":1,\"stored\":1,\"created_ns\":1}"),
	     "layer 0 is malformed"},
	    {CHAIN("{\"id\":1,\"parent\":0,\"full\":true,\"mem\":\"m\",\"state\":\"s\","
		   "\"present\":-1,\"stored\":1,\"created_ns\":1}"),
	     "layer 0 is malformed"},
	    {CHAIN("{\"id\":1,\"parent\":0,\"full\":true,\"mem\":\"m\",\"state\":\"s\","
		   "\"present\":1,\"stored\":1,\"created_ns\":1.5}"),
	     "layer 0 is malformed"},
	    {CHAIN("{\"id\":1,\"id\":1,\"parent\":0,\"full\":true,\"mem\":\"m\",\"state\":\"s\","
		   "\"present\":1,\"stored\":1,\"created_ns\":1}"),
	     "not valid JSON"},
	    /* file names must be plain names */
	    {CHAIN(LAYER(1, 0, true, "../x", "s")), "layer 0 is malformed"},
	    {CHAIN(LAYER(1, 0, true, "m", "../x")), "layer 0 is malformed"},
	    {CHAIN(LAYER(1, 0, true, "a/b", "s")), "layer 0 is malformed"},
	    {CHAIN(LAYER(1, 0, true, "/etc/passwd", "s")), "layer 0 is malformed"},
	    {CHAIN(LAYER(1, 0, true, ".hidden", "s")), "layer 0 is malformed"},
	    {CHAIN(LAYER(1, 0, true, "..", "s")), "layer 0 is malformed"},
	    {CHAIN(LAYER(1, 0, true, ".", "s")), "layer 0 is malformed"},
	    {CHAIN(LAYER(1, 0, true, "", "s")), "layer 0 is malformed"},
	    {CHAIN(LAYER(1, 0, true, "m", "")), "layer 0 is malformed"},
	    {CHAIN(LAYER(1, 0, true, "a b", "s")), "layer 0 is malformed"},
	    {CHAIN(LAYER(1, 0, true, "a\\tb", "s")), "layer 0 is malformed"},
	    {CHAIN(LAYER(1, 0, true, "a\\u007fb", "s")), "layer 0 is malformed"},
	    {CHAIN(LAYER(1, 0, true, "caf\\u00e9", "s")), "layer 0 is malformed"},
	    {CHAIN(LAYER(1, 0, true, "a\\u0000/../x", "s")), "not valid JSON"},
	    {CHAIN(LAYER(1, 0, true,
			 "1234567890123456789012345678901234567890123456789012345678901234", "s")),
	     "layer 0 is malformed"},
	    {CHAIN(LAYER(1, 0, true, "m",
			 "1234567890123456789012345678901234567890123456789012345678901234"
			 "1234567890")),
	     "layer 0 is malformed"},
	    {CHAIN(LAYER(1, 0, true, "m", "s") "," LAYER(2, 1, false, "x/../../y", "s")),
	     "layer 1 is malformed"},
	    /* order: first full, then each one not full with the previous id as parent */
	    {CHAIN(LAYER(1, 0, false, "m", "s")), "layer 0 does not follow"},
	    {CHAIN(LAYER(0, 0, true, "m", "s")), "does not follow"},
	    {CHAIN(LAYER(1, 0, true, "m", "s") "," LAYER(2, 1, true, "m2", "s2")),
	     "layer 1 does not follow layer 0"},
	    {CHAIN(LAYER(1, 0, true, "m", "s") "," LAYER(2, 0, false, "m2", "s2")),
	     "layer 1 does not follow layer 0"},
	    {CHAIN(LAYER(1, 0, true, "m", "s") "," LAYER(3, 2, false, "m2", "s2")),
	     "layer 1 does not follow layer 0"},
	    {CHAIN(LAYER(5, 0, true, "m", "s") "," LAYER(5, 5, false, "m2", "s2")),
	     "layer 1 does not follow layer 0"},
	    {CHAIN(LAYER(5, 0, true, "m", "s") "," LAYER(4, 5, false, "m2", "s2")),
	     "layer 1 does not follow layer 0"},
	    {CHAIN(LAYER(1, 0, true, "m", "s") "," LAYER(2, 1, false, "m2",
							 "s2") "," LAYER(3, 1, false, "m3", "s3")),
	     "layer 2 does not follow layer 1"},
	};
	expect_chain_cases(cases, sizeof(cases) / sizeof(cases[0]));
}

/* 256 layers parse; 257 do not. */
static void test_chain_layer_cap(void **st)
{
	(void)st;
	size_t cap = 200 + (CHAIN_MAX_LAYERS + 1) * 200;
	char *t = malloc(cap);
	assert_non_null(t);
	struct chain *c = calloc(1, sizeof(*c));
	assert_non_null(c);
	for (int n = CHAIN_MAX_LAYERS; n <= CHAIN_MAX_LAYERS + 1; n++) {
		size_t o = (size_t)snprintf(t, cap,
					    "{\"format\":\"cove-chain\",\"version\":1,\"chain_id\":"
					    "\"" CHAIN_ID "\",\"ram_size\":4096,\"layers\":[");
		for (int i = 0; i < n; i++)
			o += (size_t)snprintf(
			    t + o, cap - o,
			    "%s{\"id\":%d,\"parent\":%d,\"full\":%s,\"mem\":\"m%d\","
			    "\"state\":\"s%d\",\"present\":1,\"stored\":0,"
			    "\"created_ns\":%d}",
			    i ? "," : "", i + 1, i, i ? "false" : "true", i, i, i);
		o += (size_t)snprintf(t + o, cap - o, "]}");
		assert_true(o < cap);
		char err[256];
		int r = chain_parse_copy(t, o, c, err, sizeof(err));
		if (n == CHAIN_MAX_LAYERS) {
			assert_int_equal(r, 0);
			assert_int_equal(c->nr_layers, CHAIN_MAX_LAYERS);
			assert_string_equal(chain_latest(c)->mem, "m255");
		} else {
			assert_int_equal(r, -EINVAL);
			assert_non_null(strstr(err, "more than 256 layers"));
		}
	}
	free(c);
	free(t);
}

/* Random byte changes and truncations of a valid chain.json. */
static void test_chain_mutations(void **st)
{
	(void)st;
	static const char text[] =
	    CHAIN(LAYER(1, 0, true, "mem-1", "state-1") "," LAYER(2, 1, false, "mem-2", "state-2"));
	static const char alphabet[] = "{}[]\":,.-+0123456789abcdef/\\u \t\n\x01\x80truefalsnl";
	const size_t len = sizeof(text) - 1;
	struct chain *c = calloc(1, sizeof(*c));
	assert_non_null(c);
	char *t = malloc(len + 1);
	assert_non_null(t);
	uint64_t seed = 0xc4a1;
	struct mutation_tally m = {0};
	for (int it = 0; it < MUTATIONS; it++) {
		size_t l = mutate_text(t, text, len, alphabet, sizeof(alphabet) - 1, &seed);
		char err[256];
		if (!mutation_tally_add(&m, chain_parse_copy(t, l, c, err, sizeof(err)), err))
			continue;
		assert_true(c->nr_layers >= 0 && c->nr_layers <= CHAIN_MAX_LAYERS);
		for (int i = 0; i < c->nr_layers; i++) {
			const struct chain_layer *cl = &c->layers[i];
			assert_true(cl->id != 0);
			assert_true(i ? !cl->full && cl->parent == c->layers[i - 1].id : cl->full);
			assert_null(strchr(cl->mem, '/'));
			assert_null(strchr(cl->state, '/'));
			assert_true(cl->mem[0] != '.' && cl->mem[0] != '\0');
			assert_true(cl->state[0] != '.' && cl->state[0] != '\0');
		}
	}
	mutation_tally_report(&m, "chain.json");
	free(t);
	free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_state_round_trip),
	    cmocka_unit_test(test_state_many_sections),
	    cmocka_unit_test(test_state_writer_caps),
	    cmocka_unit_test(test_state_bad_files),
	    cmocka_unit_test(test_state_mutations),
	    cmocka_unit_test(test_mem_layout),
	    cmocka_unit_test(test_mem_header_round_trip),
	    cmocka_unit_test(test_mem_header_bad),
	    cmocka_unit_test(test_mem_header_mutations),
	    cmocka_unit_test(test_chain_parse_valid),
	    cmocka_unit_test(test_chain_parse_bad),
	    cmocka_unit_test(test_chain_layer_cap),
	    cmocka_unit_test(test_chain_mutations),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
