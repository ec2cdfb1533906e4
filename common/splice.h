/* Two streams spliced both ways: `cove forward` on the host, port forwarding in cove-init. */
#ifndef COVE_SPLICE_H
#define COVE_SPLICE_H

/*
 * Copies a->b and b->a until both directions have ended. The end of one direction (EOF or a
 * failed write) is passed on as a half-close (shutdown SHUT_WR); a read error (a reset) ends
 * both. Closes neither fd.
 */
void fd_splice(int a, int b);

#endif
