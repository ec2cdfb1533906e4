/*
 * libFuzzer target: the snapshot file parsers (snapshot/): the state file (state_parse), the
 * memory layer header and page index (mem_layer_header_parse, mem_layer_open), chain.json
 * (chain_parse) and the keys file (keyfile_parse). The first input byte picks the parser; the
 * harness writes the CRCs a writer would have, so mutations reach the fields behind them.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/byteorder.h"
#include "common/crc32.h"
#include "fuzz.h"
#include "snapshot/chain.h"
#include "snapshot/keyfile.h"
#include "snapshot/mem_layer.h"
#include "snapshot/state_file.h"

#define HEAD_BYTES 256 /* of the 4 KiB memory layer header the input spells out; the rest is 0 */
#define FILE_CAP   (1ULL << 36) /* sparse layer files up to 64 GiB */

/* A refusal is -EINVAL (or -EFBIG/-EIO for files) with one line of text. */
static void check_refusal(int r, const char *err)
{
	if (r == 0)
		return;
	if (r != -EINVAL && r != -EIO && r != -EFBIG)
		abort();
	if (!err[0] || strchr(err, '\n'))
		abort();
}

static void fuzz_state(const uint8_t *p, size_t len, bool raw)
{
	uint8_t *b = malloc(len ? len : 1);
	if (!b)
		return;
	memcpy(b, p, len);
	if (!raw && len >= STATE_HDR_SIZE) {
		put_le32(b + 24, crc32_update(0, b + STATE_HDR_SIZE, len - STATE_HDR_SIZE));
		put_le32(b + 28, crc32_update(0, b, 28));
	}
	struct state_section_ref *s;
	size_t n;
	char err[256] = "";
	int r = state_parse(b, len, &s, &n, err, sizeof(err));
	check_refusal(r, err);
	for (size_t i = 0; !r && i < n; i++) {
		/* Every section lies inside the buffer, after the header. */
		if (s[i].payload < b + STATE_HDR_SIZE || s[i].payload + s[i].len > b + len)
			abort();
		if (state_find(s, n, s[i].type, s[i].instance) > &s[i])
			abort();
	}
	free(s);
	free(b);
}

/* A scratch file for mem_layer_open, which opens by path (O_NOFOLLOW: no /proc/self/fd). */
static const char *scratch_path(void)
{
	static char path[64];
	if (!path[0])
		snprintf(path, sizeof(path), "%s/cove-fuzz-layer-%d",
			 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp", (int)getpid());
	return path;
}

static void fuzz_mem_layer(const uint8_t *p, size_t len, bool raw)
{
	uint8_t *hdr = calloc(1, MEM_LAYER_HDR);
	if (!hdr)
		return;
	size_t head = len < HEAD_BYTES ? len : HEAD_BYTES;
	memcpy(hdr, p, head);
	if (!raw)
		put_le32(hdr + MEM_LAYER_HDR - 4, crc32_update(0, hdr, MEM_LAYER_HDR - 4));
	struct mem_layer_info li;
	char err[512] = "";
	int r = mem_layer_header_parse(hdr, MEM_LAYER_HDR, &li, err, sizeof(err));
	check_refusal(r, err);
	if (r || mem_layer_file_size(&li) > FILE_CAP || li.bitmap_off < MEM_LAYER_HDR) {
		free(hdr);
		return;
	}
	/* The page index: the rest of the input at the bitmap offset, its CRC as written. */
	bool enc = li.flags & MEM_LAYER_ENCRYPTED;
	size_t bmlen = (size_t)li.bitmap_len * (enc ? 2 : 1);
	uint8_t *bm = calloc(1, bmlen ? bmlen : 1);
	if (!bm) {
		free(hdr);
		return;
	}
	memcpy(bm, p + head, len - head < bmlen ? len - head : bmlen);
	if (!raw) {
		put_le32(hdr + 108, crc32_update(0, bm, bmlen));
		put_le32(hdr + MEM_LAYER_HDR - 4, crc32_update(0, hdr, MEM_LAYER_HDR - 4));
	}
	const char *path = scratch_path();
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		abort();
	if (pwrite(fd, hdr, MEM_LAYER_HDR, 0) != (ssize_t)MEM_LAYER_HDR ||
	    pwrite(fd, bm, bmlen, (off_t)li.bitmap_off) != (ssize_t)bmlen ||
	    ftruncate(fd, (off_t)mem_layer_file_size(&li)))
		abort();
	close(fd);
	struct mem_layer l;
	r = mem_layer_open(&l, path, err, sizeof(err));
	check_refusal(r, err);
	if (!r) {
		for (uint64_t pg = 0; pg < l.info.nr_pages && pg < 4096; pg++)
			(void)mem_layer_has(&l, pg);
		mem_layer_close(&l);
	}
	free(bm);
	free(hdr);
}

static void fuzz_chain(const uint8_t *p, size_t len)
{
	static struct chain c; /* ~150 KiB: not on the stack */
	char err[256] = "";
	memset(&c, 0, sizeof(c));
	int r = chain_parse((const char *)p, len, &c, err, sizeof(err));
	check_refusal(r, err);
	if (r)
		return;
	if (c.nr_layers < 0 || c.nr_layers > CHAIN_MAX_LAYERS)
		abort();
	for (int i = 0; i < c.nr_layers; i++) {
		/* File names are plain names inside the chain directory. */
		const struct chain_layer *l = &c.layers[i];
		if (memchr(l->mem, '\0', sizeof(l->mem)) == NULL || strchr(l->mem, '/') ||
		    memchr(l->state, '\0', sizeof(l->state)) == NULL || strchr(l->state, '/'))
			abort();
	}
	/* Digests (version 2): capped, plain names, and every layer's files have one. */
	if (c.nr_digests < 0 || c.nr_digests > CHAIN_MAX_DIGESTS)
		abort();
	for (int i = 0; i < c.nr_digests; i++)
		if (memchr(c.digests[i].name, '\0', sizeof(c.digests[i].name)) == NULL ||
		    strchr(c.digests[i].name, '/') || c.digests[i].name[0] == '.')
			abort();
	for (int i = 0; c.has_digests && i < c.nr_layers; i++)
		if (!chain_digest_get(&c, c.layers[i].mem) ||
		    !chain_digest_get(&c, c.layers[i].state))
			abort();
	if (c.has_digests && (c.gen == 0 || c.gen > CHAIN_GEN_MAX))
		abort();
	(void)chain_latest(&c);
}

static void fuzz_keys(const uint8_t *p, size_t len, bool raw)
{
	uint8_t *b = malloc(len ? len : 1);
	if (!b)
		return;
	memcpy(b, p, len);
	/* Header: magic, version, chain id, type, config_len @32, wrapped_len @36, kcv; then CRC.
	 */
	if (!raw && len >= 40) {
		uint64_t body = 56 + (uint64_t)get_le32(b + 32) + get_le32(b + 36);
		if (body + 4 == len)
			put_le32(b + body, crc32_update(0, b, (size_t)body));
	}
	enum keyprov_type type;
	char config[KEYPROV_CONFIG_MAX + 1];
	uint8_t id[CRYPTO_CHAIN_ID_LEN];
	char err[512] = "";
	int r = keyfile_parse(b, len, "keys", &type, config, sizeof(config), id, err, sizeof(err));
	check_refusal(r, err);
	if (!r && strlen(config) > KEYPROV_CONFIG_MAX)
		abort();
	free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	/* Low bits pick the parser; bit 7 leaves the CRCs as the input has them. */
	bool raw = data[0] & 0x80;
	const uint8_t *p = data + 1;
	size_t len = size - 1;
	switch (data[0] & 3) {
	case 0:
		fuzz_state(p, len, raw);
		break;
	case 1:
		fuzz_mem_layer(p, len, raw);
		break;
	case 2:
		fuzz_chain(p, len);
		break;
	default:
		fuzz_keys(p, len, raw);
	}
	return 0;
}
