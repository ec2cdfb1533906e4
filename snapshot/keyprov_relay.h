/* The key relay: a host process that runs the key provider for a VMM that cannot (a jail). */
#ifndef COVE_KEYPROV_RELAY_H
#define COVE_KEYPROV_RELAY_H

#include <stddef.h>
#include <stdint.h>

#include "snapshot/keyprov.h"

/*
 * A jailed VMM has no shell, no key-cmd, no cove-pkcs11 and no PKCS#11 module in its root, and
 * may not exec. Before entering the jail it forks the relay, which keeps the host's view and
 * runs the provider for it: each request (wrap or unwrap, the provider's type and config, the
 * input) is one SOCK_SEQPACKET message, each answer (0 or -errno, the output, one line of
 * error) another. The provider still comes from the host command line: the relay refuses a
 * type or config other than the one it was started for, so a VMM taken over by its guest can
 * ask it for nothing a VMM could not do before the jail. It ends when the socket closes.
 */
struct keyrelay {
	int sock; /* the VMM's end; -1: none */
	int pid;  /* the relay process */
};

/* Forks the relay for provider `spec` (key-cmd:... or pkcs11:...). 0 or -errno with err. */
int keyrelay_start(struct keyrelay *kr, const char *spec, char *err, size_t errlen);
/* Closes the VMM's end (the relay exits) and reaps it. Safe on one never started. */
void keyrelay_stop(struct keyrelay *kr);
/* keyprov.c's backend when a provider has a relay: one round trip. As keyprov_cmd_run. */
int keyrelay_call(int sock, enum keyprov_type type, const char *config, int wrap, const uint8_t *in,
		  size_t in_len, uint8_t *out, size_t cap, size_t *out_len, char *err,
		  size_t errlen);

#endif
