/*
 * libFuzzer target: the overlay map parser (devices/overlay.c, overlay_map_parse). The harness
 * puts right CRCs into a copy of the input (header and bitmap), so mutations get past the
 * checksums to the fields behind them; a map that parses must describe bytes inside the input.
 */
#include <stdlib.h>

#include "common/byteorder.h"
#include "common/crc32.h"
#include "devices/overlay.h"
#include "fuzz.h"

static size_t header_len(uint32_t version)
{
	switch (version) {
	case 1:
		return OVERLAY_MAP_HDR_V1;
	case OVERLAY_MAP_VERSION:
		return OVERLAY_MAP_HDR_SIZE;
	case OVERLAY_MAP_VERSION_SEALED:
		return OVERLAY_MAP_HDR_SEALED;
	default:
		return 0;
	}
}

/* The CRCs the writer would have put there: the bitmap's first (the header covers it). */
static void fix_crcs(uint8_t *b, size_t len)
{
	if (len < 12)
		return;
	size_t hdr = header_len(get_le32(b + 8));
	if (!hdr || len < hdr)
		return;
	put_le32(b + 32, crc32_update(0, b + hdr, len - hdr));
	put_le32(b + hdr - 4, crc32_update(0, b, hdr - 4));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	/* First byte: leave the CRCs as they are (odd) or fix them (even). */
	bool raw = data[0] & 1;
	size_t len = size - 1;
	uint8_t *b = malloc(len ? len : 1);
	if (!b)
		return 0;
	memcpy(b, data + 1, len);
	if (!raw)
		fix_crcs(b, len);
	struct overlay_map_info m;
	char err[256];
	int r = overlay_map_parse(b, len, &m, err, sizeof(err));
	if (r == 0) {
		/* The bitmap it hands back lies inside the buffer, after the header. */
		if (m.bitmap < b || m.bitmap + m.bitmap_bytes != b + len)
			abort();
		if (m.nr_chunks == 0 || (m.nr_chunks + 7) / 8 != m.bitmap_bytes)
			abort();
		/* No bit names a chunk past the disk. */
		if (m.nr_chunks % 8 && m.bitmap[m.bitmap_bytes - 1] >> (m.nr_chunks % 8))
			abort();
		if (m.version == OVERLAY_MAP_VERSION_SEALED &&
		    (m.mac < b || m.mac + OVERLAY_MAC_LEN > m.bitmap))
			abort();
	} else if (r != -EINVAL || !err[0] || strchr(err, '\n')) {
		abort(); /* a refusal is -EINVAL with one line */
	}
	free(b);
	return 0;
}
