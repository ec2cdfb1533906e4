/* Two streams spliced both ways: `cove forward` on the host, port forwarding and the egress proxy
 * in cove-init. */
#ifndef COVE_SPLICE_H
#define COVE_SPLICE_H

/*
 * Copies a->b and b->a until both directions have ended, each direction through its own bounded
 * buffer, so a peer that stops reading one way never stalls the other way. An EOF is passed on,
 * once its buffered bytes are written, as shutdown(SHUT_WR), and the other direction goes on; a
 * peer that takes no more ends that direction only; a reset (read error) ends both. Makes both fds
 * non-blocking; closes neither. Returns 0, or -errno of the error that ended it.
 */
int fd_splice(int a, int b);

#endif
