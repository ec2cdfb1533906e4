/* CRC-32 (IEEE 802.3, zlib's): the checksum of every on-disk format cove writes. */
#ifndef COVE_CRC32_H
#define COVE_CRC32_H

#include <stddef.h>
#include <stdint.h>

/*
 * Continues `crc` (0 to start) over `len` bytes: reflected polynomial 0xEDB88320, init and
 * xorout 0xFFFFFFFF, so crc32_update(0, "123456789", 9) == 0xCBF43926.
 */
uint32_t crc32_update(uint32_t crc, const void *buf, size_t len);

#endif
