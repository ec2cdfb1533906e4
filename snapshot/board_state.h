/* Snapshot state of every board device, as state-file sections (one plain struct per device). */
#ifndef COVE_BOARD_STATE_H
#define COVE_BOARD_STATE_H

#include <stddef.h>

#include "devices/board.h"
#include "common/log.h"
#include "snapshot/state_file.h"

/* Finishes in-flight device work (the vCPUs are paused) so the state saved is final. */
void board_quiesce(struct board *b);
/* Appends one SEC_DEVICE section per device. */
void board_save(struct board *b, struct state_buf *buf);
/*
 * Applies saved device state to a board built with the same devices. Everything is checked
 * before the guest runs; -EINVAL with a one-line reason in `err`.
 */
int board_restore(struct board *b, const struct state_section_ref *s, size_t n, char *err,
		  size_t errlen);
/* After the vCPU state is loaded, just before the vCPUs start: one interrupt per running
 * virtio device and unconditional next notifications (virtio_mmio_resume_restored), reset
 * vsock, rescan queues. */
void board_resume_restored(struct board *b, struct logger *log);

#endif
