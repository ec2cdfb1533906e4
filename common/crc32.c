/* CRC-32 through zlib's table-driven crc32(), in chunks its uInt length can hold. */
#include "common/crc32.h"

#include <zlib.h>

uint32_t crc32_update(uint32_t crc, const void *buf, size_t len)
{
	const unsigned char *p = buf;
	while (len) {
		uInt n = len > (1u << 30) ? (1u << 30) : (uInt)len;
		crc = (uint32_t)crc32(crc, p, n);
		p += n;
		len -= n;
	}
	return crc;
}
