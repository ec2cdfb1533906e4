/* agent.h: what the parts of cove-init's guest agent (exec, files, ports, identity, broker) share.
 */
#ifndef COVE_AGENT_H
#define COVE_AGENT_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "common/log.h"
#include "common/rlimit_name.h"
#include "egress_proxy.h"
#include "proto/agent_wire.h"

#define BROKER_PORT	   1025 /* host port (CID 2) of cove-broker */
#define BROKER_SOCK	   "/run/cove/broker.sock"
#define AGENT_CHUNK	   65536	/* what the agent reads from a child at once */
#define AGENT_FILE_MAX	   (1ull << 30) /* put/get move at most 1 GiB */
#define AGENT_SESSIONS_MAX 128
#define AGENT_QUEUE_MAX	   (1u << 20) /* output a session buffers while no host reads it */
#define EXEC_ARGS_MAX	   256
#define EXEC_ARG_LEN_MAX   4096
#define TOKEN_HEX_MAX	   128

/* agent_req.c: replies, peer and request checks (unit-tested); the framing is proto/agent_wire. */
int wire_reply_ok(int fd);
int wire_reply_error(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Whether the agent may serve the peer of an accepted connection: only the host (a vsock peer
 * with CID 2), never a guest process (vsock loopback, CID 1 or the guest's own CID). In test
 * mode (unix_peer) the agent listens on a Unix socket and its peers are the test's. */
bool wire_peer_allowed(const struct sockaddr *sa, socklen_t len, bool unix_peer);

/* An exec request, validated (agent_req.c). Strings point into the JSON message. */
struct exec_req {
	const char *argv[EXEC_ARGS_MAX + 1];
	const char *env[EXEC_ARGS_MAX + 1];
	const char *cwd;
	const char *user;
	bool tty;
	bool stdin_open;
	unsigned rows, cols;
	struct rlimit_val rlimits[RLIMITS_MAX]; /* setrlimit each before the exec */
	unsigned nrlimits;
};
int exec_req_parse(json_t *msg, struct exec_req *r, char *err, size_t errlen);

/* passwd.c: /etc/passwd lookup by name or numeric uid, over a buffer. */
struct pw_ent {
	uid_t uid;
	gid_t gid;
	char name[64];
	char home[256];
	char shell[256];
};
int passwd_find(const char *buf, size_t len, const char *user, struct pw_ent *out);
int passwd_lookup(const char *user, struct pw_ent *out);

struct session;

/* The agent process: one of these, passed to every thread. */
struct agent {
	pthread_mutex_t lock;
	pthread_cond_t child_cond; /* a child was spawned: the reaper has work */
	uint64_t spawns;	   /* children forked, counted under lock with the broadcast */
	struct session *sessions;
	unsigned nsessions;
	unsigned next_id;
	uint64_t epoch; /* identity from the host; the broker proxy adds these */
	char token[TOKEN_HEX_MAX + 1];
	/* Test mode outside a VM (cove-init agent --unix PATH): listen on a Unix socket that speaks
	 * cove's hybrid handshake itself, serve PATH.broker.sock, reach the broker at PATH_1025. */
	const char *test_uds;
	/* 127.0.0.1:3128 (test mode: a free port), relayed to the host's vsock port 1026. */
	struct egress_proxy egress;
	struct logger *log;
};

/* agent.c */
pid_t agent_start(struct logger *log);
int agent_run(const char *test_uds, struct logger *log);

/* agent_exec.c */
int exec_handle(struct agent *ag, int fd, json_t *msg);
int attach_handle(struct agent *ag, int fd, json_t *msg);
void exec_child_exited(struct agent *ag, pid_t pid, int wstatus);
json_t *exec_sessions_json(struct agent *ag);

/* exec_env.c: PATH, HOME, USER, LOGNAME, SHELL, TERM, the proxy variables (egress_env.c) for
 * 127.0.0.1:proxy_port, then r->env, whose entries replace defaults of the same name. NULL when
 * out of memory; free with exec_env_free. */
char **exec_env_build(const struct exec_req *r, const struct pw_ent *pw, uint16_t proxy_port);
void exec_env_free(char **env);

/* agent_files.c */
int files_put(int fd, json_t *msg);
int files_get(int fd, json_t *msg);

/* agent_forward.c */
int forward_handle(int fd, json_t *msg);

/* agent_mount.c: a tmpfs for a container's config.json (cove-oci) */
int mount_handle(int fd, json_t *msg);

/* agent_hostname.c: a container's hostname from its config.json (cove-oci) */
int hostname_handle(struct agent *ag, int fd, json_t *msg);

/* identity.c */
int identity_handle(struct agent *ag, int fd, json_t *msg);

/* identity_machine.c: the hostname and machine id an identity event names. A guest whose
 * /etc/machine-id changes is a new machine: it runs the executables in IDENTITY_HOOK_DIR (name
 * order, as root, with COVE_HOSTNAME and COVE_MACHINE_ID) before the host gets its answer. */
#define IDENTITY_HOOK_DIR "/etc/cove/identity.d"
#define MACHINE_ID_HEX	  32
bool identity_hostname_valid(const char *h);
bool identity_machine_id_valid(const char *id);
/* Sets the hostname (when not NULL) and /etc/machine-id (when not NULL and different, then the
 * hooks run; *new_machine true). 0, or -errno when /etc/machine-id could not be written. */
int identity_machine_apply(struct agent *ag, const char *hostname, const char *machine_id,
			   bool *new_machine);

/* broker_proxy.c */
int broker_proxy_start(struct agent *ag);

#endif
