/* Copying bytes both ways between the guest's connection and the upstream socket, with
 * half-close, an idle timeout and a byte cap per direction. */
#ifndef COVE_BROKER_EGRESS_RELAY_H
#define COVE_BROKER_EGRESS_RELAY_H

#include <stdint.h>

#define EGRESS_RELAY_BUF (16 * 1024) /* per direction */

struct relay_stats {
	uint64_t up;   /* guest -> upstream */
	uint64_t down; /* upstream -> guest */
};

/* Relays between guest and upstream (blocking sockets are fine: only poll-ready ones are
 * touched, with MSG_DONTWAIT) until both directions ended, idle_ms passed without a byte,
 * a direction went over max_bytes, stop_fd became readable, or an error. When one side ends
 * its sending, the other side's sending is shut down (SHUT_WR) once its buffer is flushed.
 * Returns why it ended: "closed", "idle timeout", "over max_bytes", "broker stopping",
 * "guest reset", "upstream reset" or "out of memory". Counts in *st. */
const char *egress_relay(int guest, int upstream, int stop_fd, int idle_ms, uint64_t max_bytes,
			 struct relay_stats *st);

#endif
