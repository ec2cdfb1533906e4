/* io_uring opcode restrictions: io_uring bypasses seccomp, so each ring is limited to its opcodes.
 */
#ifndef COVE_URING_RESTRICT_H
#define COVE_URING_RESTRICT_H

#include <liburing.h>

/*
 * For a ring created with IORING_SETUP_R_DISABLED: registers the n restrictions, then enables
 * the ring. 0 or -errno. (Debian's liburing 2.3 declares io_uring_register_restrictions and
 * io_uring_enable_rings but its library does not export them: the system call does both.)
 */
int uring_restrict_enable(struct io_uring *ring, struct io_uring_restriction *res, unsigned n);

#endif
