/* cove-broker beside a named sandbox: found, started detached under a lock of its own, granted,
 * ended. The broker is a process of its own; the VMM never links or maps any of it. */
#ifndef COVE_LIFECYCLE_BROKER_H
#define COVE_LIFECYCLE_BROKER_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "lifecycle/root.h"

/* In run/NAME/: the supervisor's life lock (the broker's pid in it) and the control socket. */
#define SBX_BROKER_LOCK	   "broker.lock"
#define SBX_BROKER_CTL_DIR "ctl" /* the VMM's jail shows it empty (vmm_args.c) */
#define SBX_BROKER_CTL	   SBX_BROKER_CTL_DIR "/broker.ctl"
/* In the sandbox directory: its stderr, its audit log, the last epoch granted. */
#define SBX_BROKER_LOG	 "broker.log"
#define SBX_BROKER_AUDIT "audit.jsonl"
#define SBX_BROKER_EPOCH "broker.epoch"
/* The sandbox's own CA for the egress proxy's interception (cove-broker --mitm-ca-dir):
 * mitm-ca.key never leaves the host (the VMM's jail shows the directory empty); mitm-ca.crt
 * goes into the guest's trust store (sandbox/ca_install.c). A fork gets a copy. */
#define SBX_BROKER_MITM_CA	"mitm-ca"
#define SBX_BROKER_MITM_CA_KEY	"mitm-ca.key" /* the names broker/mitm_ca.h gives them */
#define SBX_BROKER_MITM_CA_CERT "mitm-ca.crt"

#define SBX_TOKEN_HEX 32 /* a grant's token: 128 bits as hex */

struct sbx_grant {
	uint64_t epoch;
	char token[SBX_TOKEN_HEX + 1];
};

/*
 * The cove-broker binary: $COVE_BROKER when set, else ../broker/cove-broker from the running
 * cove's directory (the build tree), else cove-broker beside it (installed), else the first in
 * PATH. 0 with its path in out, or -ENOENT with one line in err.
 */
int sbx_broker_find(char *out, size_t cap, char *err, size_t errlen);

/* `cove-broker check-policy FILE`: 0, or -EINVAL with the broker's one line in err. */
int sbx_broker_check_policy(const char *exe, const char *file, char *err, size_t errlen);

/*
 * Makes sure NAME's broker runs: when nobody holds run/NAME/broker.lock, starts one detached
 * (own session) through a small supervisor that holds the lock for exactly as long as the
 * broker lives: --policy POLICY --listen run/NAME/vsock.sock_1025 --ctl run/NAME/broker.ctl
 * --egress-listen run/NAME/vsock.sock_1026 --mitm-ca-dir DIR/mitm-ca (made 0700 here, so the
 * VMM's jail can hide it) --audit DIR/audit.jsonl --initial-epoch <the last one granted>,
 * stderr to DIR/broker.log, and
 * waits until its control socket answers. A live one is reused. The caller holds the start lock
 * and made run/NAME. 0 or -errno with one line in err.
 */
int sbx_broker_up(const struct sbx_root *r, const char *name, int dfd, const char *policy,
		  char *err, size_t errlen);

/* "grant" on NAME's control socket: a new epoch and token into g (the epoch is also kept in
 * DIR/broker.epoch so the next broker goes on from it). 0 or -errno with one line in err. */
int sbx_broker_grant(const struct sbx_root *r, const char *name, int dfd, struct sbx_grant *g,
		     char *err, size_t errlen);

/* 1 when NAME's broker runs (its supervisor holds broker.lock), 0 when not, or -errno. */
int sbx_broker_running(const struct sbx_root *r, const char *name);

/* Ends NAME's broker if one runs: SIGTERM, SIGKILL after 5 s. 0 once none runs, or -errno. */
int sbx_broker_end(const struct sbx_root *r, const char *name);

/* The control channel (broker/PROTOCOL.md): one framed request and its reply on a fresh
 * connection, timeout_s for each step. 0 with *reply, or -errno with one line in err. */
int sbx_broker_ctl_call(const char *ctl, json_t *req, double timeout_s, json_t **reply, char *err,
			size_t errlen);
/* A grant's reply into g: {"ok":true,"epoch":N,"token":"<32 hex>"}; else -EPROTO with err. */
int sbx_broker_grant_parse(json_t *reply, struct sbx_grant *g, char *err, size_t errlen);

#endif
