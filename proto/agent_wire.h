/* The cove-init agent wire protocol (guest/init/AGENT.md), shared by the host and the guest. */
#ifndef COVE_PROTO_AGENT_WIRE_H
#define COVE_PROTO_AGENT_WIRE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define AGENT_PORT    1024	 /* vsock port the agent listens on */
#define WIRE_MSG_MAX  (1u << 20) /* a JSON message: 4-byte BE length + at most 1 MiB */
#define WIRE_DATA_MAX (1u << 20) /* a typed data frame carries at most 1 MiB */

/* Typed data frames after an exec/attach handshake: 1 type byte + 4-byte BE length + payload. */
enum wire_type {
	WIRE_STDIN = 'i',  /* host -> agent: bytes for the command's stdin */
	WIRE_CLOSE = 'c',  /* host -> agent: stdin ends */
	WIRE_SIGNAL = 's', /* host -> agent: 4-byte BE signal number for the command's group */
	WIRE_WINSZ = 'w',  /* host -> agent: 2-byte BE rows, 2-byte BE cols (tty sessions) */
	WIRE_STDOUT = 'o', /* agent -> host: stdout (or the tty's output) */
	WIRE_STDERR = 'e', /* agent -> host: stderr */
	WIRE_EXIT = 'x',   /* agent -> host: JSON {"exit_code":N,"signal":S}; nothing follows */
};

/* Pure parsers (unit-tested). A message body must be one JSON object and nothing else; the
 * peer's bytes in err are made terminal-safe. */
int wire_len_parse(const uint8_t hdr[4], uint32_t max, uint32_t *len);
int wire_msg_parse(const char *buf, size_t len, json_t **out, char *err, size_t errlen);

/* I/O over a connected stream (or a pipe). wire_read_full: 0 once n bytes are read, -ENODATA
 * at EOF before the first byte, -EPIPE at EOF after it. wire_write_full never raises SIGPIPE
 * on a socket. */
int wire_read_full(int fd, void *buf, size_t n);
int wire_write_full(int fd, const void *buf, size_t n);
int wire_msg_read(int fd, json_t **out, char *err, size_t errlen);
int wire_msg_write(int fd, json_t *obj);
int wire_data_write(int fd, uint8_t type, const void *buf, size_t len);
/* Reads one typed frame whose payload fits cap; a larger one is an error (-EMSGSIZE). */
int wire_data_read(int fd, uint8_t *type, void *buf, size_t cap, size_t *len);

#endif
