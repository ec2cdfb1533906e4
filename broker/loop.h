/* cove-broker's single-threaded epoll loop over the guest and control Unix sockets. */
#ifndef COVE_BROKER_LOOP_H
#define COVE_BROKER_LOOP_H

#include "broker.h"

#define LOOP_MAX_CONNS	 128
#define LOOP_IDLE_S	 120 /* a connection with no traffic for this long is closed */
#define LOOP_OUT_HIGHWAT (2u << 20)

/* Binds a SOCK_STREAM Unix socket at path (replacing a stale socket file), mode 0600.
 * Returns the listening fd or -errno. */
int loop_listen_unix(const char *path);

/* Serves until SIGINT/SIGTERM. Returns 0 or -errno. */
int loop_run(struct broker *b, int guest_fd, int ctl_fd);

#endif
