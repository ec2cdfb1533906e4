/* Frame header parsing and writing (pure, no I/O). */
#include "frame.h"

#include <errno.h>

int frame_peek(const uint8_t *buf, size_t len, size_t *payload_len)
{
	uint32_t n;

	if (len < FRAME_HDR)
		return 0;
	n = (uint32_t)buf[0] << 24 | (uint32_t)buf[1] << 16 | (uint32_t)buf[2] << 8 | buf[3];
	if (n > FRAME_MAX)
		return -EMSGSIZE;
	if (len - FRAME_HDR < n)
		return 0;
	*payload_len = n;
	return 1;
}

void frame_header(uint8_t hdr[FRAME_HDR], uint32_t n)
{
	hdr[0] = (uint8_t)(n >> 24);
	hdr[1] = (uint8_t)(n >> 16);
	hdr[2] = (uint8_t)(n >> 8);
	hdr[3] = (uint8_t)n;
}
