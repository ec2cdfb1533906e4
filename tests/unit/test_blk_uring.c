/* Unit tests for devices/blk_uring: the io_uring block back end on a temp file. */
#include <sys/uio.h>

#include "helpers.h"
#include "devices/blk_uring.h"

static int done_calls, done_res;

static void count_done(struct blk_io *io, int res)
{
	(void)io;
	done_calls++;
	done_res = res;
}

/*
 * The kernel refuses the submission: the request fails with that error instead of staying
 * "in flight" forever, so a drain (reset, snapshot) returns.
 */
static void test_blk_uring_submit_failure(void **state)
{
	(void)state;
	char img[] = "/tmp/cove-uring-XXXXXX";
	tmp_file(img, 1 << 20);
	struct blk_uring b;
	int r = blk_uring_open(&b, img, false);
	if (r == -ENOSYS || r == -EPERM) {
		unlink(img);
		skip();
	}
	assert_int_equal(r, 0);
	static uint8_t buf[8192];
	struct iovec iov = {buf, sizeof(buf)};
	struct blk_io io = {.op = BLK_OP_READ,
			    .offset = 0,
			    .len = sizeof(buf),
			    .iov = &iov,
			    .niov = 1,
			    .done = count_done};
	done_calls = 0;
	assert_int_equal(blk_uring_queue(&b, &io), 0);
	/* Swap the ring's fd for one that is not a ring: io_uring_enter() then fails. */
	int saved = dup(b.ring.ring_fd);
	assert_true(saved >= 0);
	assert_true(dup2(b.efd, b.ring.ring_fd) >= 0);
	blk_uring_drain(&b);
	assert_true(dup2(saved, b.ring.ring_fd) >= 0);
	close(saved);
	assert_int_equal(done_calls, 1);
	assert_true(done_res < 0);
	assert_int_equal(b.inflight, 0);
	/* The ring still works, and the failed request is not run later. */
	io = (struct blk_io){.op = BLK_OP_READ,
			     .offset = 0,
			     .len = sizeof(buf),
			     .iov = &iov,
			     .niov = 1,
			     .done = count_done};
	iov = (struct iovec){buf, sizeof(buf)};
	assert_int_equal(blk_uring_queue(&b, &io), 0);
	blk_uring_drain(&b);
	assert_int_equal(done_calls, 2);
	assert_int_equal(done_res, 0);
	blk_uring_close(&b);
	assert_int_equal(done_calls, 2);
	unlink(img);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_blk_uring_submit_failure),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
