/* Host side of the cove-init agent protocol (guest/init/AGENT.md): framing, sandbox names, calls.
 */
#ifndef COVE_AGENT_CLIENT_H
#define COVE_AGENT_CLIENT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define AGENT_PORT     1024
#define AGENT_MSG_MAX  (1u << 20) /* a JSON message: 4-byte BE length + at most 1 MiB */
#define AGENT_DATA_MAX (1u << 20) /* a typed data frame's payload */
#define AGENT_PATH_MAX 108	  /* sun_path */

/* Typed data frames after exec/attach: 1 type byte + 4-byte BE length + payload. */
enum agent_frame {
	AGENT_STDIN = 'i',
	AGENT_CLOSE = 'c',
	AGENT_SIGNAL = 's',
	AGENT_WINSZ = 'w',
	AGENT_STDOUT = 'o',
	AGENT_STDERR = 'e',
	AGENT_EXIT = 'x',
};

/* Pure helpers (unit-tested). */
int agent_len_parse(const uint8_t hdr[4], uint32_t max, uint32_t *len);
int agent_msg_parse(const char *buf, size_t len, json_t **out, char *err, size_t errlen);
int agent_exit_parse(const char *buf, size_t len, int *status);
int agent_connect_reply_parse(const char *line, char *err, size_t errlen);
int agent_state_dir(char *buf, size_t len);
int agent_resolve(const char *sandbox, char *uds, size_t len, char *err, size_t errlen);

/* I/O over a connected stream. */
int agent_read_full(int fd, void *buf, size_t n);
int agent_write_full(int fd, const void *buf, size_t n);
int agent_msg_read(int fd, json_t **out, char *err, size_t errlen);
int agent_msg_write(int fd, json_t *obj);
int agent_data_write(int fd, uint8_t type, const void *buf, size_t len);
int agent_data_read(int fd, uint8_t *type, void *buf, size_t cap, size_t *len);

/* Connects to the agent through the sandbox's vsock Unix socket (hybrid "CONNECT 1024"),
 * retrying for up to wait_s seconds while the guest is not listening yet. Returns an fd. */
int agent_connect(const char *uds, double wait_s, char *err, size_t errlen);
/* Connects, sends req, reads the reply; a reply with "ok":false becomes -EREMOTEIO with its
 * error in err. On success *reply is the reply and the returned fd continues the stream. */
int agent_call(const char *uds, double wait_s, json_t *req, json_t **reply, char *err,
	       size_t errlen);

/* Streams an exec/attach session on fd: stdin out, stdout/stderr in, signals forwarded, the
 * terminal in raw mode for a tty. Returns the command's shell-style status (code or 128+sig),
 * or -errno with err set. */
int agent_session_stream(int fd, bool tty, bool send_stdin, char *err, size_t errlen);

/* The identity event after restore/fork: fresh 32-byte RNG seed and the host's clock, plus the
 * broker epoch/token. 0 or -errno with a one-line err. CONNECT is tried again every
 * AGENT_IDENTITY_HANDSHAKE_S seconds for up to wait_s seconds (a fork uses
 * AGENT_IDENTITY_WAIT_S): one that reaches a guest still handling its restore can go
 * unanswered. */
#define AGENT_IDENTITY_WAIT_S	   10
#define AGENT_IDENTITY_HANDSHAKE_S 2
int agent_send_identity(const char *vsock_uds, uint64_t epoch, const char *token_hex, double wait_s,
			char *err, size_t errlen);

/* Subcommands (one file each). */
int cmd_exec(int argc, char **argv);
int cmd_attach(int argc, char **argv);
int cmd_cp(int argc, char **argv);
int cmd_forward(int argc, char **argv);
int cmd_ps(int argc, char **argv);

#endif
