/* Message framing shared by the guest and control channels: 4-byte big-endian length + JSON. */
#ifndef COVE_BROKER_FRAME_H
#define COVE_BROKER_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define FRAME_HDR 4
#define FRAME_MAX (1u << 20) /* largest payload either side may send */

/* Looks at the start of buf. Returns 1 with *payload_len set when a whole frame is there,
 * 0 when more bytes are needed, -EMSGSIZE when the announced length is over FRAME_MAX. */
int frame_peek(const uint8_t *buf, size_t len, size_t *payload_len);

/* Writes the 4-byte header for a payload of n bytes. */
void frame_header(uint8_t hdr[FRAME_HDR], uint32_t n);

#endif
