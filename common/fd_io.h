/* Whole-buffer reads and writes on a socket, pipe or file: short transfers and EINTR resumed. */
#ifndef COVE_FD_IO_H
#define COVE_FD_IO_H

#include <stddef.h>
#include <sys/types.h>

/* Reads exactly n bytes: 0, -errno, -ENODATA at EOF before the first byte, -EPIPE at EOF after
 * it. */
int read_full(int fd, void *buf, size_t n);
/* Writes exactly n bytes: 0 or -errno. Never raises SIGPIPE on a socket. */
int write_full(int fd, const void *buf, size_t n);
/* Reads until EOF or cap bytes, whichever comes first: the count, or -errno. */
ssize_t read_upto(int fd, void *buf, size_t cap);

#endif
