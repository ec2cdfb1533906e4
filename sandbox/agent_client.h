/* Host side of the cove-init agent protocol (guest/init/AGENT.md): framing, sandbox names, calls.
 */
#ifndef COVE_AGENT_CLIENT_H
#define COVE_AGENT_CLIENT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/agent_wire.h" /* the framing: wire_*, WIRE_*, AGENT_PORT */

#define AGENT_PATH_MAX 108 /* sun_path */

/* Pure helpers (unit-tested). */
int agent_exit_parse(const char *buf, size_t len, int *status);
int agent_connect_reply_parse(const char *line, char *err, size_t errlen);
/* The runtime directory of registered sandboxes: ${COVE_RUN_DIR:-$XDG_RUNTIME_DIR/cove
 * or /run/cove}; each NAME/vsock.sock in it is a sandbox by name. */
int agent_state_dir(char *buf, size_t len);
int agent_resolve(const char *sandbox, char *uds, size_t len, char *err, size_t errlen);

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
/* The same with a fresh random token at epoch 0: the guest's old broker grant is void until the
 * host grants again (after a restore or fork). */
int agent_send_void_identity(const char *vsock_uds, double wait_s, char *err, size_t errlen);

/*
 * Which machine the guest is (a named sandbox): its hostname and /etc/machine-id, each sent
 * when not NULL. A guest whose machine id changes runs its identity hooks before it answers
 * (guest/init/AGENT.md); *new_machine (when not NULL) says whether it did.
 */
struct agent_machine {
	const char *hostname;
	const char *machine_id;
	bool new_machine; /* out: the guest took a new machine id */
};
/* agent_send_identity with m (may be NULL); token_hex NULL: a void token at epoch 0. */
int agent_send_identity_as(const char *vsock_uds, uint64_t epoch, const char *token_hex,
			   struct agent_machine *m, double wait_s, char *err, size_t errlen);

/* Subcommands (one file each). */
int cmd_exec(int argc, char **argv);
int cmd_attach(int argc, char **argv);
int cmd_cp(int argc, char **argv);
int cmd_forward(int argc, char **argv);
int cmd_ps(int argc, char **argv);

#endif
