/* io_uring opcode restrictions; see uring_restrict.h. */
#include "common/uring_restrict.h"

#include <errno.h>
#include <sys/syscall.h>
#include <unistd.h>

int uring_restrict_enable(struct io_uring *ring, struct io_uring_restriction *res, unsigned n)
{
	if (syscall(__NR_io_uring_register, ring->ring_fd, IORING_REGISTER_RESTRICTIONS, res, n) <
		0 ||
	    syscall(__NR_io_uring_register, ring->ring_fd, IORING_REGISTER_ENABLE_RINGS, NULL, 0) <
		0)
		return -errno;
	return 0;
}
